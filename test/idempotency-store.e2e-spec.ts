import { randomBytes, randomUUID } from 'node:crypto';
import { Cluster, type Redis } from 'ioredis';
import { redisSettingsSchema } from '../src/config/redis.schema';
import {
  type IdempotencyClaim,
  type IdempotencyQuota,
  type IdempotencyRef,
  type IdempotencyStore,
  IdempotencyStoreErrorCode,
  IdempotencyStoreException,
  type Settlement,
  type StoredResponse,
} from '../src/forwarding/idempotency-store';
import type { ForwardingProfile } from '../src/forwarding/forwarding.exception';
import { MemoryIdempotencyStore } from '../src/forwarding/idempotency-store.memory';
import { idempotencyKeyHash } from '../src/forwarding/order-request';
import { RedisIdempotencyStore } from '../src/redis/idempotency-store.redis';
import { createRedisConnection, type RedisClient } from '../src/redis/redis.connection';
import { redisKeys } from '../src/redis/redis.constants';
import { AesGcmTokenCipher } from '../src/token/aes-gcm-token.cipher';
import { freePort } from './support/ports';
import { type RedisTopology, startTopology, TOPOLOGY_KINDS } from './support/redis/topology';
import { waitFor } from './support/wait';

const CLIENT = 'acme-preprod';
const TTL_MS = 60_000;
/** The cache key: it authenticates what the store replays. */
const CACHE_KEY = randomBytes(32);

/** A record of `caller` (by default the one caller most tests need). */
function ref(clientId: string, keyHash: string, caller = 'checkout'): IdempotencyRef {
  return { clientId, caller, keyHash };
}

function claimOf(bodyHash = 'body-a'): IdempotencyClaim {
  return { bodyHash, owner: randomUUID(), leaseMs: 30_000 };
}

/** Bounds of the passthrough's (or `profile`'s) records; 0 turns one off. */
function quotaOf(
  maxRecords: number,
  maxBytes = 0,
  reserveBytes = 0,
  profile: ForwardingProfile = 'forward',
): IdempotencyQuota {
  return {
    profile,
    maxRecords,
    maxBytes,
    reserveBytes,
    recordsSetting: 'RECORDS_SETTING',
    bytesSetting: 'BYTES_SETTING',
  };
}

const RELEASE: Settlement = { state: 'released' };
const UNKNOWN: Settlement = { state: 'unknown' };
const completed = (response: StoredResponse): Settlement => ({ state: 'completed', response });

/** Every byte value, so a replay is proven byte-exact (no UTF-8 round trip). */
const BINARY_BODY = Buffer.from(Array.from({ length: 256 }, (_, i) => i));

/** Every key on every master: KEYS asks one node, and a cluster spreads the keys. */
async function allKeys(client: Redis | Cluster): Promise<string[]> {
  await waitFor(() => client.status === 'ready', { timeoutMs: 10_000, what: 'the raw client' });
  const nodes = client instanceof Cluster ? client.nodes('master') : [client];
  return (await Promise.all(nodes.map((n) => n.keys('*')))).flat();
}

/**
 * One contract, two implementations: the Redis store against a real Redis (standalone,
 * Sentinel and Cluster), and the memory store. The behaviour must not change with the
 * deployment, only its reach.
 */
describe.each(TOPOLOGY_KINDS)('IdempotencyStore (%s Redis)', (kind) => {
  let redis: RedisTopology;
  const connections: RedisClient[] = [];

  /** A store on its own broker-style connection (no offline queue), once it is connected. */
  async function redisStore(): Promise<RedisIdempotencyStore> {
    const settings = redisSettingsSchema.parse({ ...redis.settings(), commandTimeoutMs: 1000 });
    const connection = createRedisConnection(settings, 'command');
    connection.on('error', () => undefined);
    connections.push(connection);
    await waitFor(() => connection.status === 'ready', {
      timeoutMs: 5000,
      what: 'the Redis connection to be ready',
    });
    return new RedisIdempotencyStore(connection, new AesGcmTokenCipher(CACHE_KEY));
  }

  beforeAll(async () => {
    redis = await startTopology(kind);
  });

  afterEach(async () => {
    connections.splice(0).forEach((c) => c.disconnect());
    await redis.flush();
  });

  afterAll(async () => {
    await redis.stop();
  });

  describe.each([
    ['RedisIdempotencyStore', () => redisStore()],
    // The memory store does not depend on the topology: once is enough.
    ...(kind === 'standalone'
      ? [['MemoryIdempotencyStore', () => new MemoryIdempotencyStore()]]
      : []),
  ] as Array<[string, () => Promise<IdempotencyStore> | IdempotencyStore]>)('%s', (_name, make) => {
    let store: IdempotencyStore;
    let key: string;

    beforeEach(async () => {
      store = await make();
      key = idempotencyKeyHash(randomUUID());
    });

    afterEach(async () => {
      await store.close();
    });

    it('grants the first claim and shows later ones the in-flight record', async () => {
      const first = claimOf('body-a');
      expect(await store.claim(ref(CLIENT, key), first, TTL_MS)).toEqual({ claimed: true });
      const second = await store.claim(ref(CLIENT, key), claimOf('body-b'), TTL_MS);
      expect(second).toEqual({
        claimed: false,
        existing: { state: 'in_flight', bodyHash: 'body-a', leaseRemainingMs: expect.any(Number) },
      });
      // The lease has what is left of its 30 s, measured on the store's clock.
      if (second.claimed || second.existing.state !== 'in_flight') throw new Error('not in flight');
      expect(second.existing.leaseRemainingMs).toBeGreaterThan(29_000);
      expect(second.existing.leaseRemainingMs).toBeLessThanOrEqual(30_000);
    });

    it('reports a lease that ran out as 0 ms left', async () => {
      await store.claim(ref(CLIENT, key), { ...claimOf('body-a'), leaseMs: 100 }, TTL_MS);
      await waitFor(
        async () => {
          const r = await store.claim(ref(CLIENT, key), claimOf('body-a'), TTL_MS);
          return (
            !r.claimed && r.existing.state === 'in_flight' && r.existing.leaseRemainingMs === 0
          );
        },
        { timeoutMs: 3000, intervalMs: 20, what: 'the lease to run out' },
      );
    });

    it('grants exactly one of many concurrent claims', async () => {
      // Several connections for Redis, so the claims really race on the server.
      const stores =
        store instanceof RedisIdempotencyStore
          ? [store, ...(await Promise.all([make(), make(), make()]))]
          : [store];
      const results = await Promise.all(
        Array.from({ length: 200 }, (_, i) =>
          stores[i % stores.length].claim(ref(CLIENT, key), claimOf(), TTL_MS),
        ),
      );
      expect(results.filter((r) => r.claimed)).toHaveLength(1);
    });

    it('replays the completed answer byte for byte, with its status and content type', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      const response = { status: 201, contentType: 'application/json', body: BINARY_BODY };
      expect(await store.settle(ref(CLIENT, key), claim.owner, completed(response), TTL_MS)).toBe(
        true,
      );
      const again = await store.claim(ref(CLIENT, key), claimOf(), TTL_MS);
      expect(again).toEqual({
        claimed: false,
        existing: { state: 'completed', bodyHash: 'body-a', response },
      });
    });

    it('keeps an empty body and a missing content type as they were', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      const response = { status: 204, contentType: undefined, body: Buffer.alloc(0) };
      await store.settle(ref(CLIENT, key), claim.owner, completed(response), TTL_MS);
      const again = await store.claim(ref(CLIENT, key), claimOf(), TTL_MS);
      expect(again.claimed === false && again.existing).toEqual({
        state: 'completed',
        bodyHash: 'body-a',
        response,
      });
    });

    it('lets only the claimant settle its claim', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      const stranger = randomUUID();
      const response = { status: 201, body: Buffer.from('{}') };
      expect(await store.settle(ref(CLIENT, key), stranger, completed(response), TTL_MS)).toBe(
        false,
      );
      expect(await store.settle(ref(CLIENT, key), stranger, UNKNOWN, TTL_MS)).toBe(false);
      expect(await store.settle(ref(CLIENT, key), stranger, RELEASE, TTL_MS)).toBe(false);
      const again = await store.claim(ref(CLIENT, key), claimOf(), TTL_MS);
      expect(again.claimed === false && again.existing.state).toBe('in_flight');
    });

    it('records an unknown outcome, which is never released', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      expect(await store.settle(ref(CLIENT, key), claim.owner, UNKNOWN, TTL_MS)).toBe(true);
      expect(await store.settle(ref(CLIENT, key), claim.owner, RELEASE, TTL_MS)).toBe(false);
      const again = await store.claim(ref(CLIENT, key), claimOf(), TTL_MS);
      expect(again).toEqual({
        claimed: false,
        existing: { state: 'unknown', bodyHash: 'body-a' },
      });
    });

    it('releases an in-flight claim so that the key can be claimed again', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      expect(await store.settle(ref(CLIENT, key), claim.owner, RELEASE, TTL_MS)).toBe(true);
      expect(await store.claim(ref(CLIENT, key), claimOf('body-b'), TTL_MS)).toEqual({
        claimed: true,
      });
    });

    it('never releases a completed record', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      await store.settle(
        ref(CLIENT, key),
        claim.owner,
        completed({ status: 201, body: Buffer.from('{}') }),
        TTL_MS,
      );
      expect(await store.settle(ref(CLIENT, key), claim.owner, RELEASE, TTL_MS)).toBe(false);
      const again = await store.claim(ref(CLIENT, key), claimOf(), TTL_MS);
      expect(again.claimed === false && again.existing.state).toBe('completed');
    });

    it('forgets a record after its TTL', async () => {
      const claim = claimOf();
      await store.claim(ref(CLIENT, key), claim, TTL_MS);
      await store.settle(
        ref(CLIENT, key),
        claim.owner,
        completed({ status: 201, body: Buffer.from('{}') }),
        150,
      );
      await waitFor(async () => (await store.claim(ref(CLIENT, key), claimOf(), TTL_MS)).claimed, {
        timeoutMs: 3000,
        intervalMs: 50,
        what: 'the completed record to expire',
      });
    });

    it('keeps keys of different clients apart', async () => {
      expect(await store.claim(ref(CLIENT, key), claimOf(), TTL_MS)).toEqual({ claimed: true });
      expect(await store.claim(ref('other-client', key), claimOf(), TTL_MS)).toEqual({
        claimed: true,
      });
    });

    it('bounds the records one caller holds per client, counting until they expire or are released', async () => {
      const bounded = (bodyHash = 'body-a') => ({ ...claimOf(bodyHash), quota: quotaOf(2) });
      const keys = [1, 2, 3].map(() => idempotencyKeyHash(randomUUID()));
      const first = bounded();
      expect(await store.claim(ref(CLIENT, keys[0]), first, TTL_MS)).toEqual({ claimed: true });
      const second = bounded();
      expect(await store.claim(ref(CLIENT, keys[1]), second, TTL_MS)).toEqual({ claimed: true });
      await store.settle(
        ref(CLIENT, keys[1]),
        second.owner,
        completed({ status: 201, body: Buffer.from('{}') }),
        TTL_MS,
      );
      const err: unknown = await store
        .claim(ref(CLIENT, keys[2]), bounded(), TTL_MS)
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(IdempotencyStoreException);
      expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.CallerLimit);
      const retryAfter = (err as IdempotencyStoreException).retryAfterSeconds!;
      expect(retryAfter).toBeGreaterThan(0);
      expect(retryAfter).toBeLessThanOrEqual(TTL_MS / 1000);
      // A repeat of a key it holds is no new record: still answered.
      expect(await store.claim(ref(CLIENT, keys[1]), bounded(), TTL_MS)).toMatchObject({
        claimed: false,
        existing: { state: 'completed' },
      });
      // Per caller and client: others are not held back by this caller's records.
      expect(await store.claim(ref(CLIENT, keys[2], 'marketing'), bounded(), TTL_MS)).toEqual({
        claimed: true,
      });
      expect(await store.claim(ref('other-client', keys[2]), bounded(), TTL_MS)).toEqual({
        claimed: true,
      });
      // A released claim frees its place, as does an expired record.
      expect(await store.settle(ref(CLIENT, keys[0]), first.owner, RELEASE, TTL_MS)).toBe(true);
      expect(await store.claim(ref(CLIENT, keys[2]), bounded(), TTL_MS)).toEqual({ claimed: true });
      const fourth = idempotencyKeyHash(randomUUID());
      await expect(store.claim(ref(CLIENT, fourth), bounded(), TTL_MS)).rejects.toThrow(
        /the most it may/,
      );
      const claimBrief = () =>
        store
          .claim(
            ref(CLIENT, idempotencyKeyHash(randomUUID()), 'brief'),
            { ...claimOf(), quota: quotaOf(1) },
            150,
          )
          .then(
            (r) => r.claimed,
            () => false,
          );
      expect(await claimBrief()).toBe(true);
      expect(await claimBrief()).toBe(false);
      await waitFor(claimBrief, {
        timeoutMs: 3000,
        intervalMs: 50,
        what: 'the expired record to free its place',
      });
      // Unbounded claims are never refused.
      expect(await store.claim(ref(CLIENT, fourth), claimOf(), TTL_MS)).toEqual({ claimed: true });
    });

    it('bounds the bytes one caller stores per client and route: in flight at the most a record may be, settled at what it holds, freed on release and expiry', async () => {
      const caller = `bytes-${randomUUID()}`;
      const answer = { status: 200, body: Buffer.alloc(3000, 1) };
      // Room for two in-flight claims of 4000 bytes, or more settled records of ~3500.
      const bytes = (profile: ForwardingProfile = 'forward') => ({
        ...claimOf(),
        quota: quotaOf(0, 9000, 4000, profile),
      });
      const claim = (c: IdempotencyClaim, ttlMs = TTL_MS) =>
        store.claim(ref(CLIENT, idempotencyKeyHash(randomUUID()), caller), c, ttlMs).then(
          (r) => r.claimed,
          (err: unknown) => err,
        );
      const keys = [0, 1, 2].map(() => idempotencyKeyHash(randomUUID()));
      const a = bytes();
      const b = bytes();
      expect(await store.claim(ref(CLIENT, keys[0], caller), a, TTL_MS)).toEqual({ claimed: true });
      expect(await store.claim(ref(CLIENT, keys[1], caller), b, TTL_MS)).toEqual({ claimed: true });
      // Two in flight hold 8000: a third does not fit, and the refusal names the setting.
      const refused = await claim(bytes());
      expect(refused).toBeInstanceOf(IdempotencyStoreException);
      expect((refused as IdempotencyStoreException).code).toBe(
        IdempotencyStoreErrorCode.CallerBytes,
      );
      expect((refused as IdempotencyStoreException).message).toMatch(/BYTES_SETTING/);
      expect((refused as IdempotencyStoreException).retryAfterSeconds).toBeGreaterThan(0);
      // Another route's records, and another caller's, are counted apart.
      expect(await claim(bytes('orders'))).toBe(true);
      expect(await store.claim(ref(CLIENT, keys[2], `${caller}-other`), bytes(), TTL_MS)).toEqual({
        claimed: true,
      });
      // Settled, each counts its 3000-byte answer plus the record's overhead (3512): room again.
      for (const [key, c] of [
        [keys[0], a],
        [keys[1], b],
      ] as const) {
        expect(
          await store.settle(
            ref(CLIENT, key, caller),
            c.owner,
            completed(answer),
            TTL_MS,
            'forward',
          ),
        ).toBe(true);
      }
      // 7024 + 4000 > 9000: still full.
      expect(await claim(bytes())).toBeInstanceOf(IdempotencyStoreException);
      // A released claim gives its bytes back.
      const released = bytes();
      const releasedRef = ref(CLIENT, idempotencyKeyHash(randomUUID()), `${caller}-r`);
      expect(await store.claim(releasedRef, released, TTL_MS)).toEqual({ claimed: true });
      expect(await store.claim(releasedRef, released, TTL_MS)).toMatchObject({ claimed: false });
      expect(await store.settle(releasedRef, released.owner, RELEASE, TTL_MS, 'forward')).toBe(
        true,
      );
      const again = bytes();
      const againRef = ref(CLIENT, idempotencyKeyHash(randomUUID()), `${caller}-r`);
      expect(await store.claim(againRef, again, TTL_MS)).toEqual({ claimed: true });
      expect(await store.claim(againRef, again, TTL_MS)).toMatchObject({ claimed: false });
      const twice = bytes();
      expect(await store.claim(ref(CLIENT, keys[0], `${caller}-r`), twice, TTL_MS)).toEqual({
        claimed: true,
      });
      expect(await claimOn(`${caller}-r`)).toBeInstanceOf(IdempotencyStoreException);
      // Records that expire give their bytes back with them.
      const brief = `${caller}-brief`;
      const claimBrief = () =>
        store.claim(ref(CLIENT, idempotencyKeyHash(randomUUID()), brief), bytes(), 150).then(
          (r) => r.claimed,
          () => false,
        );
      expect(await claimBrief()).toBe(true);
      expect(await claimBrief()).toBe(true);
      expect(await claimBrief()).toBe(false);
      await waitFor(claimBrief, {
        timeoutMs: 3000,
        intervalMs: 50,
        what: 'the expired records to give their bytes back',
      });

      function claimOn(who: string) {
        return store
          .claim(ref(CLIENT, idempotencyKeyHash(randomUUID()), who), bytes(), TTL_MS)
          .then(
            (r) => r.claimed,
            (err: unknown) => err,
          );
      }
    });

    it("keeps callers' keys apart: another caller's same key and body is its own record", async () => {
      const claim = claimOf('body-a');
      await store.claim(ref(CLIENT, key, 'checkout'), claim, TTL_MS);
      const answer = { status: 201, contentType: 'application/json', body: Buffer.from('{}') };
      await store.settle(ref(CLIENT, key, 'checkout'), claim.owner, completed(answer), TTL_MS);
      // Neither A's answer (same body) nor a 422 (other body): B's key is B's.
      const b = claimOf('body-a');
      expect(await store.claim(ref(CLIENT, key, 'marketing'), b, TTL_MS)).toEqual({
        claimed: true,
      });
      expect(await store.settle(ref(CLIENT, key, 'marketing'), b.owner, RELEASE, TTL_MS)).toBe(
        true,
      );
      expect(await store.claim(ref(CLIENT, key, 'marketing'), claimOf('body-b'), TTL_MS)).toEqual({
        claimed: true,
      });
      // A settled record is not the other caller's to settle either.
      expect(await store.settle(ref(CLIENT, key, 'marketing'), claim.owner, RELEASE, TTL_MS)).toBe(
        false,
      );
      expect(await store.claim(ref(CLIENT, key, 'checkout'), claimOf(), TTL_MS)).toEqual({
        claimed: false,
        existing: { state: 'completed', bodyHash: 'body-a', response: answer },
      });
    });
  });

  describe('RedisIdempotencyStore specifics', () => {
    it("stores under the client's hash tag, keyed by the key's hash, with the TTL", async () => {
      const store = await redisStore();
      const raw = redis.client();
      try {
        const callerKey = 'order-42-secret-ish';
        const keyHash = idempotencyKeyHash(callerKey);
        const claim = claimOf();
        await store.claim(ref(CLIENT, keyHash), claim, TTL_MS);
        await store.settle(
          ref(CLIENT, keyHash),
          claim.owner,
          completed({ status: 201, body: Buffer.from('{}') }),
          90_000,
        );
        const keys = await allKeys(raw);
        expect(keys).toEqual([redisKeys.callerIdempotency(CLIENT, 'checkout', keyHash)]);
        expect(keys[0]).toMatch(new RegExp(`^tb:\\{${CLIENT}\\}:idem:[0-9a-f]{64}$`));
        expect(keys[0]).not.toContain(callerKey);
        expect(keys[0]).not.toContain(keyHash);
        const ttl = await raw.pttl(keys[0]);
        expect(ttl).toBeGreaterThan(80_000);
        expect(ttl).toBeLessThanOrEqual(90_000);
      } finally {
        raw.disconnect();
      }
    });

    it('keeps the stored answer sealed under the cache key, never in clear', async () => {
      const store = await redisStore();
      const raw = redis.client();
      try {
        const keyHash = idempotencyKeyHash(randomUUID());
        const claim = claimOf();
        const answer = { status: 201, body: Buffer.from('{"orderId":"o-secret-ish-42"}') };
        await store.claim(ref(CLIENT, keyHash), claim, TTL_MS);
        await store.settle(ref(CLIENT, keyHash), claim.owner, completed(answer), TTL_MS);
        const stored = await raw.hgetallBuffer(
          redisKeys.callerIdempotency(CLIENT, 'checkout', keyHash),
        );
        expect(Buffer.concat(Object.values(stored)).includes('o-secret-ish-42')).toBe(false);
        expect(await store.claim(ref(CLIENT, keyHash), claimOf(), TTL_MS)).toMatchObject({
          existing: { state: 'completed', response: answer },
        });
        // Sealed for its record: moved under another caller's key it does not open.
        await raw.hset(redisKeys.callerIdempotency(CLIENT, 'marketing', keyHash), stored);
        const err: unknown = await store
          .claim(ref(CLIENT, keyHash, 'marketing'), claimOf(), TTL_MS)
          .catch((e: unknown) => e);
        expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.Tampered);
      } finally {
        raw.disconnect();
      }
    });

    it('refuses a stored answer changed in Redis (status, body, content type, moved, re-hashed), never replaying it', async () => {
      const store = await redisStore();
      const raw = redis.client();
      try {
        const tamper: Array<[string, Record<string, string | Buffer>]> = [
          ['the body', { body: Buffer.from('{"id":"evil","redirect":"https://evil.example"}') }],
          ['the status', { status: '200' }],
          ['the content type', { ct: 'text/html' }],
          ['the body hash', { fp: 'body-b' }],
          ['the MAC', { mac: 'ffffffff:AAAA' }],
          ['a missing MAC (a downgrade)', { mac: '' }],
        ];
        for (const [what, fields] of tamper) {
          const keyHash = idempotencyKeyHash(randomUUID());
          const claim = claimOf();
          await store.claim(ref(CLIENT, keyHash), claim, TTL_MS);
          const answer = {
            status: 201,
            contentType: 'application/json',
            body: Buffer.from('{"id":"o-1"}'),
          };
          await store.settle(ref(CLIENT, keyHash), claim.owner, completed(answer), TTL_MS);
          const genuine = await store.claim(ref(CLIENT, keyHash), claimOf(), TTL_MS);
          expect(genuine).toEqual({
            claimed: false,
            existing: { state: 'completed', bodyHash: 'body-a', response: answer },
          });
          await raw.hset(redisKeys.callerIdempotency(CLIENT, 'checkout', keyHash), fields);
          const err: unknown = await store
            .claim(ref(CLIENT, keyHash), claimOf(), TTL_MS)
            .catch((e: unknown) => e);
          expect([what, err]).toEqual([what, expect.any(IdempotencyStoreException)]);
          expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.Tampered);
        }
        // A genuine record copied to another key (or client, or caller) does not verify there either.
        const from = idempotencyKeyHash(randomUUID());
        const claim = claimOf();
        await store.claim(ref(CLIENT, from), claim, TTL_MS);
        await store.settle(
          ref(CLIENT, from),
          claim.owner,
          completed({ status: 201, body: Buffer.from('{}') }),
          TTL_MS,
        );
        const copied = await raw.hgetallBuffer(
          redisKeys.callerIdempotency(CLIENT, 'checkout', from),
        );
        for (const [client, keyHash, caller] of [
          [CLIENT, idempotencyKeyHash(randomUUID()), 'checkout'],
          ['other-client', from, 'checkout'],
          [CLIENT, from, 'marketing'],
        ]) {
          await raw.hset(redisKeys.callerIdempotency(client, caller, keyHash), copied);
          const err: unknown = await store
            .claim(ref(client, keyHash, caller), claimOf(), TTL_MS)
            .catch((e: unknown) => e);
          expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.Tampered);
        }
        // A forged in-flight record with another body hash is refused too.
        const forged = idempotencyKeyHash(randomUUID());
        await raw.hset(redisKeys.callerIdempotency(CLIENT, 'checkout', forged), {
          st: 'c',
          fp: 'body-a',
          status: '201',
          ct: '',
          body: 'x',
        });
        const err: unknown = await store
          .claim(ref(CLIENT, forged), claimOf(), TTL_MS)
          .catch((e: unknown) => e);
        expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.Tampered);
      } finally {
        raw.disconnect();
      }
    });

    it('replays a record written before records were per caller, for the same body only, and never writes one', async () => {
      const store = await redisStore();
      const raw = redis.client();
      try {
        // As the previous version wrote it: keyed by client and key hash, no caller in its MACs.
        const signer = new AesGcmTokenCipher(CACHE_KEY);
        const keyHash = idempotencyKeyHash(randomUUID());
        const answer = { status: 201, contentType: 'application/json', body: Buffer.from('{}') };
        const legacyKey = redisKeys.idempotency(CLIENT, keyHash);
        await raw.hset(legacyKey, {
          st: 'c',
          fp: 'body-a',
          own: 'old-replica',
          status: '201',
          ct: answer.contentType,
          body: answer.body,
          fpm: signer.mac(['fp', CLIENT, keyHash, 'body-a']),
          mac: signer.mac(['answer', CLIENT, keyHash, '201', answer.contentType, answer.body]),
        });
        await raw.pexpire(legacyKey, TTL_MS);
        const before = await raw.hgetallBuffer(legacyKey);
        // A retry (same body) reaching an upgraded replica still gets its answer.
        expect(await store.claim(ref(CLIENT, keyHash), claimOf('body-a'), TTL_MS)).toEqual({
          claimed: false,
          existing: { state: 'completed', bodyHash: 'body-a', response: answer },
        });
        // Another body is no repeat of it: no 422 from a record that cannot name its caller.
        const other = claimOf('body-b');
        expect(await store.claim(ref(CLIENT, keyHash), other, TTL_MS)).toEqual({ claimed: true });
        await store.settle(ref(CLIENT, keyHash), other.owner, completed(answer), TTL_MS);
        expect(await raw.hgetallBuffer(legacyKey)).toEqual(before);
        // A forged old-format record is refused like any other.
        await raw.hset(legacyKey, { mac: signer.mac(['answer', CLIENT, keyHash, '200', '', '']) });
        const err: unknown = await store
          .claim(ref(CLIENT, keyHash, 'marketing'), claimOf('body-a'), TTL_MS)
          .catch((e: unknown) => e);
        expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.Tampered);
      } finally {
        raw.disconnect();
      }
    });

    it('accepts records written under a previous cache key (rotation)', async () => {
      const before = await redisStore();
      const keyHash = idempotencyKeyHash(randomUUID());
      const claim = claimOf();
      await before.claim(ref(CLIENT, keyHash), claim, TTL_MS);
      await before.settle(
        ref(CLIENT, keyHash),
        claim.owner,
        completed({ status: 201, body: Buffer.from('{}') }),
        TTL_MS,
      );
      const settings = redisSettingsSchema.parse({ ...redis.settings(), commandTimeoutMs: 1000 });
      const connection = createRedisConnection(settings, 'command');
      connections.push(connection);
      await waitFor(() => connection.status === 'ready', { timeoutMs: 5000, what: 'Redis' });
      const after = new RedisIdempotencyStore(
        connection,
        new AesGcmTokenCipher(randomBytes(32), [CACHE_KEY]),
      );
      expect(await after.claim(ref(CLIENT, keyHash), claimOf(), TTL_MS)).toMatchObject({
        claimed: false,
        existing: { state: 'completed', response: { status: 201 } },
      });
    });

    it('fails fast with a translated error when Redis is unreachable', async () => {
      const port = await freePort();
      const settings = redisSettingsSchema.parse({
        url: `redis://127.0.0.1:${port}`,
        commandTimeoutMs: 300,
      });
      const connection = createRedisConnection(settings, 'command');
      connection.on('error', () => undefined);
      connections.push(connection);
      const store = new RedisIdempotencyStore(connection, new AesGcmTokenCipher(CACHE_KEY));
      const started = Date.now();
      const err: unknown = await store
        .claim(ref(CLIENT, idempotencyKeyHash('k')), claimOf(), TTL_MS)
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(IdempotencyStoreException);
      expect((err as IdempotencyStoreException).code).toBe(IdempotencyStoreErrorCode.Unavailable);
      expect(Date.now() - started).toBeLessThan(2000);
    });
  });
});
