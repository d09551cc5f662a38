import {
  BODY_BUDGET_FALLBACK_BYTES,
  bodyBudgetBytes,
  type Hold,
  RequestBudgets,
} from './request-budgets';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

function budgets(inFlight = 2, bodyBytes = 10, callerBodyBytes = 6): RequestBudgets {
  return new RequestBudgets({
    maxInFlightPerCaller: { orders: inFlight, forward: inFlight },
    bodyBytes,
    callerBodyBytes,
  });
}

function held(entered: ReturnType<RequestBudgets['enter']>): Hold {
  if ('kind' in entered) throw new Error(`refused: ${entered.kind}`);
  return entered;
}

describe(bodyBudgetBytes.name, () => {
  it('takes the configured figure as it is', () => {
    expect(bodyBudgetBytes(5 * MiB, 256 * MiB, 24 * GiB)).toBe(5 * MiB);
  });

  it("is a quarter of the container's memory limit: 64 MiB of the chart's 256 MiB", () => {
    expect(bodyBudgetBytes(0, 256 * MiB, 24 * GiB)).toBe(64 * MiB);
    expect(bodyBudgetBytes(0, 1 * GiB, 24 * GiB)).toBe(256 * MiB);
  });

  it('falls back to 64 MiB without a limit, whichever way Node reports none', () => {
    expect(bodyBudgetBytes(0, 0, 24 * GiB)).toBe(BODY_BUDGET_FALLBACK_BYTES);
    expect(bodyBudgetBytes(0, 2 ** 64, 24 * GiB)).toBe(BODY_BUDGET_FALLBACK_BYTES);
  });
});

describe(RequestBudgets.name, () => {
  it('bounds the requests per route and caller, and gives the place back on release', () => {
    const b = budgets(2);
    const first = held(b.enter('orders', 'shop'));
    held(b.enter('orders', 'shop'));
    expect(b.enter('orders', 'shop')).toEqual({ kind: 'in_flight', max: 2 });
    // Another caller, and the same caller's passthrough requests, are counted apart.
    held(b.enter('orders', 'other'));
    held(b.enter('forward', 'shop'));
    expect(b.requests('orders')).toBe(3);
    first.release();
    first.release();
    expect(b.requests('orders')).toBe(2);
    held(b.enter('orders', 'shop'));
  });

  it('takes no bound at 0', () => {
    const b = budgets(0);
    for (let i = 0; i < 100; i++) held(b.enter('forward', 'shop'));
    expect(b.requests('forward')).toBe(100);
  });

  it("refuses bytes past the replica's budget first, then past the caller's share, taking nothing when it refuses", () => {
    const b = budgets(0, 10, 6);
    const shop = held(b.enter('orders', 'shop'));
    expect(shop.reserve(4)).toBeUndefined();
    expect(shop.reserve(3)).toEqual({ kind: 'caller_bytes', max: 6 });
    expect(b.bodyBytes).toBe(4);
    const other = held(b.enter('orders', 'other'));
    expect(other.reserve(6)).toBeUndefined();
    // 10 of 10 held: the replica is full, whoever asks.
    expect(shop.reserve(1)).toEqual({ kind: 'replica_bytes', max: 10 });
    expect(held(b.enter('forward', 'third')).reserve(1)).toEqual({
      kind: 'replica_bytes',
      max: 10,
    });
    other.release();
    expect(b.bodyBytes).toBe(4);
    expect(shop.reserve(2)).toBeUndefined();
    shop.release();
    expect(b.bodyBytes).toBe(0);
  });

  it('takes nothing for a request already released (an abort racing its last chunk)', () => {
    const b = budgets();
    const hold = held(b.enter('orders', 'shop'));
    hold.release();
    expect(hold.reserve(5)).toBeUndefined();
    expect(b.bodyBytes).toBe(0);
  });
});
