import { EndpointGate, EndpointGates, EndpointLimiter } from './endpoint-limiter';

describe(EndpointLimiter.name, () => {
  const cap = { concurrency: 2, perSecond: 3, leaseMs: 10_000 };

  it('grants at most `concurrency` places at once, and one again once given back', async () => {
    const limiter = new EndpointLimiter(() => 0);
    const a = limiter.take('https://as', cap);
    const b = limiter.take('https://as', cap);
    expect([a.granted, b.granted]).toEqual([true, true]);
    expect(limiter.take('https://as', cap)).toEqual({ granted: false, retryInMs: 0 });
    // Another endpoint is bounded apart.
    expect(limiter.take('https://other', cap).granted).toBe(true);
    if (a.granted) await a.release();
    expect(limiter.take('https://as', cap).granted).toBe(true);
  });

  it('counts a request toward the rate until a second after it ended, and says when the next may go', async () => {
    let now = 1_000;
    const limiter = new EndpointLimiter(() => now);
    const rate = { concurrency: 0, perSecond: 3, leaseMs: 10_000 };
    const slots = [];
    for (let i = 0; i < 3; i++) {
      const slot = limiter.take('https://as', rate);
      expect(slot.granted).toBe(true);
      slots.push(slot);
      now += 100;
    }
    // All three still running: the rate waits for one to end, checked again within a second.
    expect(limiter.take('https://as', rate)).toEqual({ granted: false, retryInMs: 1000 });
    for (const slot of slots) if (slot.granted) await slot.release();
    now += 999;
    expect(limiter.take('https://as', rate).granted).toBe(false);
    now += 1;
    expect(limiter.take('https://as', rate).granted).toBe(true);
  });
});

describe(EndpointGate.name, () => {
  const inOrder = async (gate: EndpointGate, urgent: boolean[]) => {
    const order: number[] = [];
    const turns = urgent.map((u, i) => {
      const turn = gate.enter(() => u);
      void turn.entered.then((entered) => entered && order.push(i));
      return turn;
    });
    await Promise.resolve();
    return { order, turns };
  };

  it('lets `passes` in at once and the next in line as each leaves', async () => {
    const gate = new EndpointGate(2);
    const { order } = await inOrder(gate, [false, false, false, false]);
    expect(order).toEqual([0, 1]);
    expect(gate.waiting).toBe(2);
    gate.leave();
    await Promise.resolve();
    expect(order).toEqual([0, 1, 2]);
    gate.leave();
    gate.leave();
    await Promise.resolve();
    expect(order).toEqual([0, 1, 2, 3]);
    // Everyone out: the next is let in at once.
    gate.leave();
    gate.leave();
    const { order: later } = await inOrder(gate, [false, false]);
    expect(later).toEqual([0, 1]);
  });

  it('lets a pass with callers waiting go before older ones', async () => {
    const gate = new EndpointGate(1);
    const { order } = await inOrder(gate, [false, false, false, true]);
    gate.leave();
    await Promise.resolve();
    expect(order).toEqual([0, 3]);
    gate.leave();
    await Promise.resolve();
    expect(order).toEqual([0, 3, 1]);
  });

  it('asks again whether a pass is urgent when a place frees, not when it queued', async () => {
    const gate = new EndpointGate(1);
    let callers = false;
    const first = gate.enter(() => false);
    const calm = gate.enter(() => false);
    const later = gate.enter(() => callers);
    const order: string[] = [];
    void calm.entered.then(() => order.push('calm'));
    void later.entered.then(() => order.push('later'));
    expect(await first.entered).toBe(true);
    callers = true;
    gate.leave();
    await Promise.resolve();
    expect(order).toEqual(['later']);
  });

  it('gives a cancelled place to nobody, and the cancelled pass learns it did not enter', async () => {
    const gate = new EndpointGate(1);
    const { order, turns } = await inOrder(gate, [false, false, false]);
    turns[1].cancel();
    expect(await turns[1].entered).toBe(false);
    expect(gate.waiting).toBe(1);
    gate.leave();
    await Promise.resolve();
    expect(order).toEqual([0, 2]);
    // Cancelling a pass already inside changes nothing.
    turns[0].cancel();
    expect(gate.waiting).toBe(0);
  });

  it("sizes itself by the cap's bounds, else by the provider pool", () => {
    expect(EndpointGate.passesFor({ concurrency: 8, perSecond: 20, leaseMs: 1 })).toBe(8);
    expect(EndpointGate.passesFor({ concurrency: 0, perSecond: 5, leaseMs: 1 })).toBe(5);
    expect(EndpointGate.passesFor({ concurrency: 0, perSecond: 0, leaseMs: 1 })).toBe(64);
    expect(EndpointGate.passesFor({ concurrency: 500, perSecond: 0, leaseMs: 1 })).toBe(64);
    expect(EndpointGate.passesFor(undefined)).toBe(64);
  });

  it('is one per endpoint', () => {
    const gates = new EndpointGates();
    const cap = { concurrency: 2, perSecond: 0, leaseMs: 1 };
    expect(gates.of('https://as/token', cap)).toBe(gates.of('https://as/token', cap));
    expect(gates.of('https://other/token', cap)).not.toBe(gates.of('https://as/token', cap));
  });
});
