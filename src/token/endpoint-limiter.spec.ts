import { EndpointLimiter } from './endpoint-limiter';

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
