import pino from 'pino';
import { testConfig } from '../../test/support/test-config';
import { ForwardingException, OrdersErrorCode } from './forwarding.exception';
import {
  type IdempotencyClaim,
  type IdempotencyRef,
  RECORD_OVERHEAD_BYTES,
} from './idempotency-store';
import { MemoryIdempotencyStore } from './idempotency-store.memory';
import { IdempotencyClaims } from './idempotency-claims';

/** A memory store that remembers the claims it was asked for. */
class RecordingStore extends MemoryIdempotencyStore {
  readonly claims: Array<{ claim: IdempotencyClaim; ttlMs: number }> = [];
  override claim(ref: IdempotencyRef, claim: IdempotencyClaim, ttlMs: number) {
    this.claims.push({ claim, ttlMs });
    return super.claim(ref, claim, ttlMs);
  }
}

function claimsWith(orders: Record<string, number>, waitTimeoutMs: number) {
  const config = testConfig({
    token: { waitTimeoutMs },
    orders: { idempotencyTtlSeconds: 60, ...orders },
  });
  const store = new RecordingStore();
  const claims = new IdempotencyClaims(
    store,
    config,
    { idempotentReplays: { labels: () => ({ inc: () => undefined }) } } as never,
    pino({ level: 'silent' }),
  );
  return { store, claims };
}

/** The lease of the one claim `claims` makes for a new key. */
async function leaseOf(orders: Record<string, number>, waitTimeoutMs = 1000): Promise<number> {
  const { store, claims } = claimsWith(orders, waitTimeoutMs);
  await claims.claim(
    'orders',
    { clientId: 'acme', caller: 'checkout', keyHash: 'k'.repeat(64) },
    'b',
  );
  expect(store.claims).toHaveLength(1);
  return store.claims[0].claim.leaseMs;
}

describe(IdempotencyClaims.name, () => {
  it('holds a claim at least as long as two token waits and two whole provider calls can run', async () => {
    const orders = { connectTimeoutMs: 1000, headersTimeoutMs: 2000, bodyTimeoutMs: 3000 };
    const deadlineMs = 1000 + 2000 + 3000;
    expect(await leaseOf(orders, 1500)).toBeGreaterThanOrEqual(2 * 1500 + 2 * deadlineMs);
  });

  it('sizes the lease from the call deadline: a longer deadline, a longer lease', async () => {
    const short = await leaseOf({
      connectTimeoutMs: 500,
      headersTimeoutMs: 1000,
      bodyTimeoutMs: 1000,
    });
    const long = await leaseOf({
      connectTimeoutMs: 500,
      headersTimeoutMs: 1000,
      bodyTimeoutMs: 60_000,
    });
    // Two calls per claim (the first, and the one after a 401), each 59 s longer.
    expect(long - short).toBe(2 * 59_000);
  });

  it('keeps the record at least twice the lease, however short its TTL', async () => {
    const { store, claims } = claimsWith({ bodyTimeoutMs: 120_000 }, 1000);
    await claims.claim(
      'orders',
      { clientId: 'acme', caller: 'checkout', keyHash: 'k'.repeat(64) },
      'b',
    );
    const [{ claim, ttlMs }] = store.claims;
    expect(ttlMs).toBeGreaterThanOrEqual(2 * claim.leaseMs);
  });

  it("counts each route's records against its own bounds, and refuses a keyed request past the bytes bound with 429 idempotency_bytes_exceeded naming the setting", async () => {
    const { store, claims } = claimsWith(
      {
        maxIdempotencyRecordsPerCaller: 5,
        maxIdempotencyBytesPerCaller: 2 * RECORD_OVERHEAD_BYTES,
      },
      1000,
    );
    const ref = (n: number) => ({
      clientId: 'acme',
      caller: 'checkout',
      keyHash: `${n}`.repeat(64),
    });
    await claims.claim('orders', ref(1), 'b');
    expect(store.claims[0].claim.quota).toMatchObject({
      profile: 'orders',
      maxRecords: 5,
      maxBytes: 2 * RECORD_OVERHEAD_BYTES,
      reserveBytes: RECORD_OVERHEAD_BYTES,
      bytesSetting: 'ORDERS_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
    });
    await claims.claim('orders', ref(2), 'b');
    const err: unknown = await claims.claim('orders', ref(3), 'b').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ForwardingException);
    expect((err as ForwardingException).code).toBe(OrdersErrorCode.IdempotencyBytesExceeded);
    expect((err as ForwardingException).problemStatus.status).toBe(429);
    expect((err as ForwardingException).message).toMatch(/ORDERS_IDEMPOTENCY_MAX_BYTES_PER_CALLER/);
    expect((err as ForwardingException).retryAfterSeconds).toBeGreaterThan(0);
    // The passthrough's records are counted apart.
    await claims.claim('forward', ref(3), 'b');
    expect(store.claims.at(-1)?.claim.quota?.profile).toBe('forward');
  });
});
