import pino from 'pino';
import { testConfig } from '../../test/support/test-config';
import type { IdempotencyClaim, IdempotencyRef } from './idempotency-store';
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
});
