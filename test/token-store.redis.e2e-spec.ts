import { hostname } from 'node:os';
import type { Cluster, Redis } from 'ioredis';
import { redisSettingsSchema } from '../src/config/redis.schema';
import { redisKeys } from '../src/redis/redis.constants';
import { createRedisConnection } from '../src/redis/redis.connection';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import { PlainTokenCipher } from '../src/token/token-cipher';
import { type TokenRecord, toRecord, withGeneration } from '../src/token/token-record';
import type { RejectionRule, TokenStoreEvent } from '../src/token/token-store';
import { TokenStoreException } from '../src/token/token-store.exception';
import { RedisCluster } from './support/redis/cluster';
import { adminCommand } from './support/redis/node';
import { StandaloneRedis } from './support/redis/standalone';
import { type RedisTopology, startTopology, TOPOLOGY_KINDS } from './support/redis/topology';
import { holdRefreshLock } from './support/refresh-lock';
import { waitFor } from './support/wait';

const CLIENT = 'acme-preprod';
const LOCK_TTL_MS = 600;

/** A store on `settings` for `clientIds`, as a replica builds it; kept in `stores` to close. */
function openStore(
  settings: ReturnType<typeof redisSettingsSchema.parse>,
  clientIds: string[],
  stores: RedisTokenStore[],
): RedisTokenStore {
  const store = new RedisTokenStore(
    createRedisConnection(settings, 'command'),
    createRedisConnection(settings, 'subscriber'),
    new PlainTokenCipher(),
    settings,
    LOCK_TTL_MS,
    clientIds,
  );
  stores.push(store);
  return store;
}

/** No floor and no budget: the tests of the fence itself. */
const OPEN: RejectionRule = { caller: 'test', floorMs: 0, perCaller: 0, windowMs: 1000 };

function record(token: string, obtainedAt: number, lifetimeMs: number): TokenRecord {
  return toRecord({ accessToken: token, obtainedAt, expiresAt: obtainedAt + lifetimeMs });
}

/** The same suite on each topology: the scripts, lock and pub/sub must not depend on it. */
describe.each(TOPOLOGY_KINDS)(`${RedisTokenStore.name} on %s Redis`, (kind) => {
  let topology: RedisTopology;
  const stores: RedisTokenStore[] = [];
  let raw: Redis | Cluster;

  function newStore(commandTimeoutMs = 300): RedisTokenStore {
    const settings = redisSettingsSchema.parse({
      ...topology.settings(),
      commandTimeoutMs,
      pingIntervalMs: 100,
    });
    return openStore(settings, [CLIENT, 'other'], stores);
  }

  /** Two stores, `b`'s events collected in `seen` once its subscription answers. */
  async function subscribedPair(): Promise<{
    a: RedisTokenStore;
    b: RedisTokenStore;
    seen: TokenStoreEvent[];
  }> {
    const a = newStore();
    const b = newStore();
    await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
    const seen: TokenStoreEvent[] = [];
    b.records.onEvent((e) => seen.push(e));
    // The subscriber connects on its own; wait until a probe message arrives.
    await waitFor(
      async () => {
        await raw.publish(redisKeys.events(CLIENT), 'u:probe');
        return seen.length > 0;
      },
      { timeoutMs: 3000, what: 'the subscription' },
    );
    return { a, b, seen };
  }

  beforeAll(async () => {
    topology = await startTopology(kind);
    raw = topology.client();
  });

  afterEach(async () => {
    await Promise.all(stores.splice(0).map((s) => s.health.close()));
    if (!(topology instanceof StandaloneRedis) || topology.redis.isRunning()) {
      await topology.flush();
    }
  });

  afterAll(async () => {
    await topology?.stop();
  });

  describe('fenced write', () => {
    it('stores the first token and any later-expiring one, never an older one', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const t0 = Date.now();
      const older = record('older', t0, 60_000);
      const newer = record('newer', t0 + 1000, 60_000);
      expect(await store.records.writeFenced(CLIENT, newer)).toBe(true);
      expect(await store.records.writeFenced(CLIENT, older)).toBe(false);
      expect(await store.records.writeFenced(CLIENT, newer)).toBe(false);
      const read = await store.records.read(CLIENT);
      expect(read).toEqual({ status: 'found', record: newer });
    });

    it('keeps the newest token when two refreshers race (a lock granted twice)', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const t0 = Date.now();
      const tokens = Array.from({ length: 20 }, (_, i) => record(`tok${i}`, t0 + i * 10, 60_000));
      // Interleave writes from both "holders" in a shuffled order.
      const order = [...tokens].sort(() => Math.random() - 0.5);
      const results = await Promise.all(
        order.map((t, i) => (i % 2 ? a : b).records.writeFenced(CLIENT, t)),
      );
      expect(results.some(Boolean)).toBe(true);
      const stored = await a.records.read(CLIENT);
      expect(stored.status === 'found' && stored.record.accessToken).toBe('tok19');
    });

    it('sets the key to expire with the token', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      await store.records.writeFenced(CLIENT, record('short', Date.now(), 5_000));
      const pttl = await raw.pttl(redisKeys.token(CLIENT));
      expect(pttl).toBeGreaterThan(3_000);
      expect(pttl).toBeLessThanOrEqual(5_000);
    });
  });

  describe('invalidate', () => {
    it('invalidates only the token with that fingerprint, once', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const t0 = Date.now();
      const current = record('current', t0, 60_000);
      await store.records.writeFenced(CLIENT, current);
      expect(
        await store.records.invalidate(
          CLIENT,
          record('stale', t0 - 1000, 60_000).fingerprint,
          OPEN,
        ),
      ).toBe('stale');
      expect((await store.records.read(CLIENT)).status).toBe('found');
      expect(await store.records.invalidate(CLIENT, current.fingerprint, OPEN)).toBe('invalidated');
      expect(await store.records.invalidate(CLIENT, current.fingerprint, OPEN)).toBe('stale');
      expect((await store.records.read(CLIENT)).status).toBe('absent');
    });

    it('lets a token requested after the invalidation replace it, but not the rejected one', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const t0 = Date.now();
      const rejected = record('rejected', t0 - 10_000, 60_000);
      await store.records.writeFenced(CLIENT, rejected);
      await store.records.invalidate(CLIENT, rejected.fingerprint, OPEN);
      expect(await store.records.writeFenced(CLIENT, rejected)).toBe(false);
      // The provider shortened its lifetimes meanwhile: earlier expiry, but requested later.
      const replacement = record('replacement', Date.now() + 5, 10_000);
      expect(await store.records.writeFenced(CLIENT, replacement)).toBe(true);
      expect(await store.records.read(CLIENT)).toEqual({ status: 'found', record: replacement });
    });
  });

  describe('rejection bounds', () => {
    const rule = (caller: string, over: Partial<RejectionRule> = {}): RejectionRule => ({
      caller,
      floorMs: 60_000,
      perCaller: 2,
      windowMs: 60_000,
      ...over,
    });

    it('holds a rejection floor: within it a rejection of the new token invalidates nothing', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const first = record('first', Date.now() - 1000, 60_000);
      await store.records.writeFenced(CLIENT, first);
      expect(await store.records.invalidate(CLIENT, first.fingerprint, rule('a'))).toBe(
        'invalidated',
      );
      const second = record('second', Date.now() + 5, 60_000);
      expect(await store.records.writeFenced(CLIENT, second)).toBe(true);
      expect(await store.records.invalidate(CLIENT, second.fingerprint, rule('b'))).toBe('floored');
      expect(await store.records.read(CLIENT)).toEqual({ status: 'found', record: second });
      const pttl = await raw.pttl(redisKeys.rejectionFloor(CLIENT));
      expect(pttl).toBeGreaterThan(50_000);
    });

    it("counts each caller's invalidations per window, apart from the others'", async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const verdicts: string[] = [];
      for (const caller of ['proxy', 'proxy', 'proxy', 'other']) {
        const t = record(`t-${verdicts.length}`, Date.now() + verdicts.length, 60_000);
        expect(await store.records.writeFenced(CLIENT, t)).toBe(true);
        verdicts.push(
          await store.records.invalidate(CLIENT, t.fingerprint, rule(caller, { floorMs: 0 })),
        );
      }
      expect(verdicts).toEqual(['invalidated', 'invalidated', 'caller_budget', 'invalidated']);
      const left = await raw.pttl(redisKeys.callerRejections(CLIENT, 'proxy'));
      expect(left).toBeGreaterThan(50_000);
      expect(left).toBeLessThanOrEqual(60_000);
    });

    it('takes the same token again when it was granted after the invalidation', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const t0 = Date.now();
      const issued = record('reissued-until-expiry', t0 - 10_000, 60_000);
      await store.records.writeFenced(CLIENT, issued);
      expect(await store.records.invalidate(CLIENT, issued.fingerprint, OPEN)).toBe('invalidated');
      // Requested before the invalidation: still refused.
      expect(await store.records.writeFenced(CLIENT, issued)).toBe(false);
      // The provider hands out the same token with what is left of its lifetime.
      const again = { ...issued, obtainedAt: Date.now() + 5 };
      expect(await store.records.writeFenced(CLIENT, again)).toBe(true);
      const read = await store.records.read(CLIENT);
      expect(read.status === 'found' && read.record.fingerprint).toBe(issued.fingerprint);
    });

    it('takes the same token again after an operator revoke, once granted in the new generation', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      const issued = record('same-after-revoke', Date.now() - 10_000, 60_000);
      await store.records.writeFenced(CLIENT, issued);
      const { generation } = await store.bus.revoke(CLIENT);
      const again = withGeneration({ ...issued, obtainedAt: Date.now() + 5 }, generation);
      expect(await store.records.writeFenced(CLIENT, again)).toBe(true);
    });
  });

  describe('endpoint slots (the fleet bound per token endpoint)', () => {
    it('grants at most `concurrency` at once across replicas, and again once one is given back', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const cap = { concurrency: 2, perSecond: 0, leaseMs: 10_000 };
      const first = await a.lock.takeEndpointSlot('https://as.test/token', cap);
      const second = await b.lock.takeEndpointSlot('https://as.test/token', cap);
      expect([first.granted, second.granted]).toEqual([true, true]);
      expect(await a.lock.takeEndpointSlot('https://as.test/token', cap)).toEqual({
        granted: false,
        retryInMs: 0,
      });
      expect((await a.lock.takeEndpointSlot('https://other.test/token', cap)).granted).toBe(true);
      if (second.granted) await second.release();
      expect((await a.lock.takeEndpointSlot('https://as.test/token', cap)).granted).toBe(true);
    });

    it('grants at most `perSecond` a second fleet-wide, naming when the next may go', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const cap = { concurrency: 0, perSecond: 3, leaseMs: 10_000 };
      const slots = [];
      for (const s of [a, b, a]) {
        slots.push(await s.lock.takeEndpointSlot('https://rate.test/token', cap));
      }
      expect(slots.map((slot) => slot.granted)).toEqual([true, true, true]);
      const refused = await b.lock.takeEndpointSlot('https://rate.test/token', cap);
      expect(refused.granted).toBe(false);
      const retryInMs = refused.granted ? 0 : refused.retryInMs;
      expect(retryInMs).toBeGreaterThan(0);
      expect(retryInMs).toBeLessThanOrEqual(1000);
      // Ended requests still count for a second after they ended, then leave room.
      for (const slot of slots) if (slot.granted) await slot.release();
      await waitFor(
        async () => (await a.lock.takeEndpointSlot('https://rate.test/token', cap)).granted,
        { timeoutMs: 3000, what: 'the rate to have room a second after the requests ended' },
      );
    });

    it("gives a dead holder's place back when its lease ends", async () => {
      const a = newStore();
      await a.health.waitUntilReady(2000);
      const cap = { concurrency: 1, perSecond: 0, leaseMs: 200 };
      expect((await a.lock.takeEndpointSlot('https://lease.test/token', cap)).granted).toBe(true);
      expect((await a.lock.takeEndpointSlot('https://lease.test/token', cap)).granted).toBe(false);
      await waitFor(
        async () => (await a.lock.takeEndpointSlot('https://lease.test/token', cap)).granted,
        { timeoutMs: 2000, what: 'the lease to end' },
      );
    });
  });

  describe('corrupt values', () => {
    it.each([
      ['a foreign value', { exp: 'soon', val: 'x' }],
      [
        'an unsealed token',
        { exp: String(Date.now() + 60_000), obt: '1', fp: 'ab', val: 'raw-token' },
      ],
      ['missing fields', { val: 'plain:tok' }],
    ])('reports %s as corrupt and lets a new token be written', async (_label, hash) => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      await raw.hset(redisKeys.token(CLIENT), hash);
      expect((await store.records.read(CLIENT)).status).toBe('corrupt');
      await store.records.discardCorrupt(CLIENT);
      const fresh = record('fresh', Date.now(), 60_000);
      expect(await store.records.writeFenced(CLIENT, fresh)).toBe(true);
      expect(await store.records.read(CLIENT)).toEqual({ status: 'found', record: fresh });
    });

    it('survives a key of the wrong Redis type', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      await raw.set(redisKeys.token(CLIENT), 'not a hash');
      // Redis answered, so it is not down: the value is foreign, and a write replaces it.
      expect(await store.records.read(CLIENT)).toEqual({ status: 'corrupt' });
      expect(store.health.healthy).toBe(true);
      const fresh = record('fresh', Date.now(), 60_000);
      expect(await store.records.writeFenced(CLIENT, fresh)).toBe(true);
      expect(await store.records.read(CLIENT)).toEqual({ status: 'found', record: fresh });
      await raw.del(redisKeys.token(CLIENT));
      await raw.rpush(redisKeys.token(CLIENT), 'a', 'list');
      expect(await store.records.read(CLIENT)).toEqual({ status: 'corrupt' });
      await store.records.discardCorrupt(CLIENT);
      expect(await raw.exists(redisKeys.token(CLIENT))).toBe(0);
    });

    it('does not let an absurd stored expiry fence out every future token', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      await raw.hset(redisKeys.token(CLIENT), { exp: '9000000000000000', obt: '1', fp: 'x' });
      expect(await store.records.read(CLIENT)).toEqual({ status: 'corrupt' });
      const fresh = record('fresh', Date.now(), 60_000);
      expect(await store.records.writeFenced(CLIENT, fresh)).toBe(true);
      expect(await store.records.read(CLIENT)).toEqual({ status: 'found', record: fresh });
    });
  });

  describe('one clock for the fleet (replicas with skewed wall clocks)', () => {
    const SKEW_MS = 30_000;

    /** A store whose replica's wall clock is `offsetMs` off. */
    function skewedStore(offsetMs: number): RedisTokenStore {
      const store = newStore();
      store.health.now = () => Date.now() + offsetMs;
      return store;
    }

    it.each([
      ['+30 s writer, -30 s reader', SKEW_MS, -SKEW_MS],
      ['-30 s writer, +30 s reader', -SKEW_MS, SKEW_MS],
      ['+30 s writer, true reader', SKEW_MS, 0],
    ])('%s: the reader sees the true remaining lifetime', async (_label, wOff, rOff) => {
      const writer = skewedStore(wOff);
      const reader = skewedStore(rOff);
      await Promise.all([writer.health.waitUntilReady(2000), reader.health.waitUntilReady(2000)]);
      const wNow = writer.health.now();
      const t = record('skewed', wNow, 60_000);
      expect(await writer.records.writeFenced(CLIENT, t)).toBe(true);
      const read = await reader.records.read(CLIENT);
      expect(read.status).toBe('found');
      const got = (read as { record: TokenRecord }).record;
      const remaining = got.expiresAt - reader.health.now();
      // True remaining: 60 s minus the few ms since the write; never more (conservative).
      expect(remaining).toBeLessThanOrEqual(60_000);
      expect(remaining).toBeGreaterThan(59_000);
      expect(got.expiresAt - got.obtainedAt).toBe(60_000);
      // The key itself expires with the token, in Redis time.
      const pttl = await raw.pttl(redisKeys.token(CLIENT));
      expect(pttl).toBeGreaterThan(59_000);
      expect(pttl).toBeLessThanOrEqual(60_000);
    });

    it("does not let a fast replica's token fence out a later one", async () => {
      const fast = skewedStore(SKEW_MS);
      const honest = skewedStore(0);
      await Promise.all([fast.health.waitUntilReady(2000), honest.health.waitUntilReady(2000)]);
      // With wall-clock expiries the fast replica's token would look 30 s newer than it is.
      expect(
        await fast.records.writeFenced(CLIENT, record('early', fast.health.now(), 60_000)),
      ).toBe(true);
      const later = record('later', honest.health.now() + 1000, 60_000);
      expect(await honest.records.writeFenced(CLIENT, later)).toBe(true);
      const read = await fast.records.read(CLIENT);
      expect(read.status === 'found' && read.record.accessToken).toBe('later');
    });

    it('stamps an invalidation in Redis time, so a replacement requested after it is stored', async () => {
      const fast = skewedStore(SKEW_MS);
      const honest = skewedStore(0);
      await Promise.all([fast.health.waitUntilReady(2000), honest.health.waitUntilReady(2000)]);
      const rejected = record('rejected', honest.health.now() - 10_000, 60_000);
      await honest.records.writeFenced(CLIENT, rejected);
      // The fast replica sees the 401; its wall clock would have put the marker 30 s ahead.
      expect(await fast.records.invalidate(CLIENT, rejected.fingerprint, OPEN)).toBe('invalidated');
      const replacement = record('replacement', honest.health.now() + 5, 10_000);
      expect(await honest.records.writeFenced(CLIENT, replacement)).toBe(true);
      expect((await fast.records.read(CLIENT)).status).toBe('found');
    });

    it("reports an expired token as absent, whatever the reader's clock says", async () => {
      const slow = skewedStore(-SKEW_MS);
      await slow.health.waitUntilReady(2000);
      // Written with 200 ms left; a reader 30 s behind would have served it for 30 s more.
      expect(
        await slow.records.writeFenced(CLIENT, record('brief', slow.health.now() - 59_800, 60_000)),
      ).toBe(true);
      const reader = skewedStore(-SKEW_MS);
      await reader.health.waitUntilReady(2000);
      await waitFor(async () => (await reader.records.read(CLIENT)).status === 'absent', {
        timeoutMs: 3000,
        what: 'the token to expire in Redis time',
      });
    });
  });

  describe('fleet-wide backoff', () => {
    it('shares one deferral across replicas, only ever extended, on Redis time', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      expect(await b.lock.refreshDeferral(CLIENT)).toBe(0);
      expect(await a.lock.deferRefresh(CLIENT, 5_000)).toBe(5_000);
      const seen = await b.lock.refreshDeferral(CLIENT);
      expect(seen).toBeGreaterThan(4_000);
      expect(seen).toBeLessThanOrEqual(5_000);
      // A shorter backoff from another replica does not cut the provider's Retry-After short.
      expect(await b.lock.deferRefresh(CLIENT, 100)).toBeGreaterThan(4_000);
      expect(await a.lock.refreshDeferral(CLIENT)).toBeGreaterThan(4_000);
      // A longer one extends it.
      expect(await b.lock.deferRefresh(CLIENT, 8_000)).toBe(8_000);
      expect(await a.lock.refreshDeferral(CLIENT)).toBeGreaterThan(7_000);
      expect(await a.lock.refreshDeferral('other')).toBe(0);
    });

    it('ends by itself', async () => {
      const a = newStore();
      await a.health.waitUntilReady(2000);
      await a.lock.deferRefresh(CLIENT, 150);
      await waitFor(async () => (await a.lock.refreshDeferral(CLIENT)) === 0, {
        timeoutMs: 2000,
        what: 'the deferral to end',
      });
    });
  });

  describe('refresh floor', () => {
    it('holds the fleet after a grant, on Redis time, until it ends by itself', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      expect(await b.lock.refreshHold(CLIENT)).toEqual({ ms: 0 });
      await a.lock.holdRefreshes(CLIENT, 300, 1000);
      const seen = await b.lock.refreshHold(CLIENT);
      expect(seen.ms).toBeGreaterThan(100);
      expect(seen.ms).toBeLessThanOrEqual(300);
      // The grant's lifetime travels with it: every replica can name it in readiness.
      expect(seen.lifetimeMs).toBe(1000);
      expect(await b.lock.refreshHold('other')).toEqual({ ms: 0 });
      await waitFor(async () => (await b.lock.refreshHold(CLIENT)).ms === 0, {
        timeoutMs: 2000,
        what: 'the floor to end',
      });
    });

    it('is never lifted by a rejection: a caller who can cause 401s cannot hurry the fleet', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const t0 = Date.now();
      const current = record('current', t0, 60_000);
      await a.records.writeFenced(CLIENT, current);
      await a.lock.holdRefreshes(CLIENT, 60_000, 60_000);
      expect(await b.records.invalidate(CLIENT, current.fingerprint, OPEN)).toBe('invalidated');
      expect((await a.lock.refreshHold(CLIENT)).ms).toBeGreaterThan(50_000);
    });

    it('is lifted when a corrupt value is discarded (the fleet has no usable token)', async () => {
      const a = newStore();
      await a.health.waitUntilReady(2000);
      await raw.hset(redisKeys.token(CLIENT), { exp: 'soon', val: 'garbage' });
      await a.lock.holdRefreshes(CLIENT, 60_000, 60_000);
      expect((await a.records.read(CLIENT)).status).toBe('corrupt');
      await a.records.discardCorrupt(CLIENT);
      expect(await a.lock.refreshHold(CLIENT)).toEqual({ ms: 0 });
      expect(await raw.exists(redisKeys.token(CLIENT))).toBe(0);
    });
  });

  describe('continuity (did Redis lose its data?)', () => {
    it('says "kept" while the data stays, "lost" once it is gone, for every replica', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      expect(await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('first');
      expect(await b.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('first');
      expect(await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('kept');
      expect(await b.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('kept');
      await topology.flush();
      expect(await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('lost');
      expect(await b.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('lost');
      expect(await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('kept');
    });

    it('costs one command per Redis node a round, whatever the number of clients', async () => {
      const a = newStore();
      await a.health.waitUntilReady(2000);
      const ids = Array.from({ length: 200 }, (_, i) => `merchant-${i}`);
      const masters = raw.isCluster ? (raw as Cluster).nodes('master') : [raw as Redis];
      const epochCalls = async () => {
        let calls = 0;
        for (const node of masters) {
          const stats = await node.info('commandstats');
          calls += Number(/cmdstat_evalsha:calls=(\d+)/.exec(stats)?.[1] ?? 0);
          calls += Number(/cmdstat_eval:calls=(\d+)/.exec(stats)?.[1] ?? 0);
        }
        return calls;
      };
      const first = await a.health.checkContinuity(ids);
      expect(new Set(first.values())).toEqual(new Set(['first']));
      const before = await epochCalls();
      const again = await a.health.checkContinuity(ids);
      const commands = (await epochCalls()) - before;
      expect([...again.keys()].sort()).toEqual([...ids].sort());
      expect(new Set(again.values())).toEqual(new Set(['kept']));
      // One per master node (the ping's probe script runs on its own timer: allow one more).
      expect(commands).toBeGreaterThanOrEqual(masters.length);
      expect(commands).toBeLessThanOrEqual(masters.length + 1);
      await topology.flush();
      const after = await a.health.checkContinuity(ids);
      expect(new Set(after.values())).toEqual(new Set(['lost']));
    });

    it('says "rolled_back" when the store went back in time (a failover that missed writes)', async () => {
      const a = newStore();
      await a.health.waitUntilReady(2000);
      await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT));
      await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT));
      // What a replica that missed the last writes holds: the same epoch, an older sequence.
      await raw.hincrby(redisKeys.epoch(CLIENT), 'seq', -2);
      expect(await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe(
        'rolled_back',
      );
    });
  });

  describe('lock', () => {
    it('grants the lock to one holder at a time', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const results = await Promise.all([
        holdRefreshLock(a, CLIENT),
        holdRefreshLock(b, CLIENT),
        holdRefreshLock(a, CLIENT),
      ]);
      expect(results.filter((l) => l !== null)).toHaveLength(1);
      await results.find((l) => l !== null)!.release();
      const again = await holdRefreshLock(b, CLIENT);
      expect(again).not.toBeNull();
      await again!.release();
    });

    it("keeps a live holder's lease beyond the TTL, and frees a dead holder's after it", async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const held = await holdRefreshLock(a, CLIENT);
      expect(held).not.toBeNull();
      // Alive: extended automatically, still held after two TTLs.
      const deadline = Date.now() + LOCK_TTL_MS * 2;
      await waitFor(() => Date.now() > deadline, { timeoutMs: 5000, what: 'two lock TTLs' });
      expect(await holdRefreshLock(b, CLIENT)).toBeNull();
      // Dead: the holder's connections vanish without releasing.
      await a.health.close();
      const taken = await waitFor(() => holdRefreshLock(b, CLIENT), {
        timeoutMs: LOCK_TTL_MS * 4,
        intervalMs: 50,
        what: "the dead holder's lease to expire",
      });
      await taken.release();
    });

    it('keeps the event loop free while a held lease cannot be extended', async () => {
      const a = newStore();
      await a.health.waitUntilReady(2000);
      const held = await holdRefreshLock(a, CLIENT);
      expect(held).not.toBeNull();
      // Redis refusing at once (connections gone) while the refresh still runs: every extension
      // fails immediately, and retrying one without a pause would starve every timer and request.
      let last = Date.now();
      let longestGapMs = 0;
      const ticker = setInterval(() => {
        longestGapMs = Math.max(longestGapMs, Date.now() - last);
        last = Date.now();
      }, 5);
      await a.health.close();
      const until = Date.now() + LOCK_TTL_MS * 2;
      await waitFor(() => Date.now() > until, { timeoutMs: 5000, what: 'two lock TTLs' });
      clearInterval(ticker);
      await held!.release().catch(() => undefined);
      expect(longestGapMs).toBeLessThan(LOCK_TTL_MS / 3);
    });
  });

  describe('revoke (generations)', () => {
    it('drops the stored token, bumps the generation, and refuses every token requested before it', async () => {
      const a = newStore();
      const b = newStore();
      await Promise.all([a.health.waitUntilReady(2000), b.health.waitUntilReady(2000)]);
      const t0 = Date.now();
      const leaked = record('leaked', t0, 60_000);
      expect(await a.records.writeFenced(CLIENT, leaked)).toBe(true);
      // A second token a partitioned replica fetched on its own, in generation 0.
      const partitioned = record('partitioned', t0 + 1000, 120_000);
      const revocation = await a.bus.revoke(CLIENT);
      expect(revocation).toMatchObject({ generation: 1, fingerprint: leaked.fingerprint });
      expect(a.bus.generation(CLIENT)).toBe(1);
      expect((await a.records.read(CLIENT)).status).toBe('absent');
      // b learns the generation from a read (or the notification); neither old token lands,
      // whoever writes it, however late it expires.
      expect(await b.records.writeFenced(CLIENT, leaked)).toBe(false);
      expect(await b.records.writeFenced(CLIENT, partitioned)).toBe(false);
      expect(b.bus.generation(CLIENT)).toBe(1);
      expect(await raw.hget(redisKeys.token(CLIENT), 'fp')).toBe(leaked.fingerprint);
      expect(await raw.hget(redisKeys.token(CLIENT), 'val')).toBeNull();
      // A token requested in the new generation does, and reads back stamped with it.
      const fresh = { ...record('fresh', Date.now(), 60_000), generation: 1 };
      expect(await b.records.writeFenced(CLIENT, fresh)).toBe(true);
      expect(await a.records.read(CLIENT)).toEqual({ status: 'found', record: fresh });
      // Another client is untouched.
      expect(a.bus.generation('other')).toBe(0);
      // Acknowledgements count replicas (processes: both stores here are one), once each.
      await a.bus.acknowledgeRevocation(CLIENT, 1);
      await b.bus.acknowledgeRevocation(CLIENT, 1);
      expect(await a.bus.revocationAcks(CLIENT, 1)).toBe(1);
      expect(await a.bus.revocationAcks(CLIENT, 2)).toBe(0);
    });

    it('tells every replica, with the new generation and the dropped fingerprint', async () => {
      const { a, b, seen } = await subscribedPair();
      const t = record('to-revoke', Date.now(), 60_000);
      await a.records.writeFenced(CLIENT, t);
      const { delivered } = await a.bus.revoke(CLIENT);
      expect(delivered).toBeGreaterThanOrEqual(kind === 'cluster' ? 0 : 2);
      await waitFor(() => seen.find((e) => e.type === 'revoked'), {
        timeoutMs: 3000,
        what: 'the revoke notification',
      });
      expect(seen.find((e) => e.type === 'revoked')).toEqual({
        type: 'revoked',
        clientId: CLIENT,
        generation: 1,
        fingerprint: t.fingerprint,
      });
      expect(b.bus.generation(CLIENT)).toBe(1);
    });

    it('shows who holds the refresh lock while it is held', async () => {
      const store = newStore();
      await store.health.waitUntilReady(2000);
      expect(await store.lock.lockState(CLIENT)).toEqual({ held: false });
      const lock = await holdRefreshLock(store, CLIENT);
      await waitFor(async () => (await store.lock.lockState(CLIENT)).holder, {
        timeoutMs: 2000,
        what: 'the holder to be recorded',
      });
      expect(await store.lock.lockState(CLIENT)).toMatchObject({
        held: true,
        holder: `${hostname()}:${process.pid}`,
      });
      await lock!.release();
      expect(await store.lock.lockState(CLIENT)).toEqual({ held: false });
      expect(store.health.topology()).toMatchObject({ kind: 'redis', mode: kind, state: 'up' });
    });
  });

  describe('pub/sub', () => {
    it('tells every replica about updates and invalidations', async () => {
      const { a, seen } = await subscribedPair();
      seen.length = 0;
      const t = record('pub', Date.now(), 60_000);
      await a.records.writeFenced(CLIENT, t);
      await a.records.invalidate(CLIENT, t.fingerprint, OPEN);
      // Late copies of the subscription probe may still arrive: leave them out.
      const real = () => seen.filter((e) => !(e.type === 'updated' && e.fingerprint === 'probe'));
      await waitFor(() => real().length >= 2, { timeoutMs: 3000, what: 'two events' });
      expect(real()).toEqual([
        { type: 'updated', clientId: CLIENT, fingerprint: t.fingerprint },
        { type: 'invalidated', clientId: CLIENT, fingerprint: t.fingerprint },
      ]);
    });
  });

  // Killing and restarting empty is a standalone server's outage; Sentinel and Cluster lose a
  // node instead, which the failover scenarios (test/faults/redis-failover) cover.
  (kind === 'standalone' ? describe : describe.skip)('outage', () => {
    it('fails fast while Redis is down and reports recovery', async () => {
      const redis = (topology as StandaloneRedis).redis;
      const store = newStore(200);
      await store.health.waitUntilReady(2000);
      let recovered = 0;
      store.health.onRecovered(() => recovered++);
      await redis.kill();
      const started = Date.now();
      await expect(store.records.read(CLIENT)).rejects.toBeInstanceOf(TokenStoreException);
      expect(Date.now() - started).toBeLessThan(500);
      expect(store.health.healthy).toBe(false);
      await redis.restart();
      await waitFor(() => store.health.healthy, { timeoutMs: 5000, what: 'the store to recover' });
      expect(recovered).toBeGreaterThanOrEqual(1);
      expect((await store.records.read(CLIENT)).status).toBe('absent');
    });

    it('says "lost" after Redis restarted empty', async () => {
      const redis = (topology as StandaloneRedis).redis;
      const a = newStore(200);
      await a.health.waitUntilReady(2000);
      expect(await a.health.checkContinuity([CLIENT]).then((m) => m.get(CLIENT))).toBe('first');
      await redis.restart();
      await waitFor(
        () =>
          a.health
            .checkContinuity([CLIENT])
            .then((m) => m.get(CLIENT))
            .catch(() => undefined),
        {
          timeoutMs: 5000,
          what: 'Redis to answer again',
        },
      ).then((c) => expect(c).toBe('lost'));
    });
  });
});

/**
 * Until its replicas have replicated something, `CLUSTER SLOTS` leaves them out, and ioredis drops
 * them from its pool: a subscriber it had placed on one moves to another node, and the SUBSCRIBE
 * sent there meanwhile is resent about 100 ms after the client is ready.
 */
describe(`${RedisTokenStore.name} on a Redis Cluster just created, with replicas`, () => {
  let cluster: RedisCluster;
  const stores: RedisTokenStore[] = [];

  function newStore(pingIntervalMs = 100): RedisTokenStore {
    const settings = redisSettingsSchema.parse({ ...cluster.settings(), pingIntervalMs });
    return openStore(settings, [CLIENT], stores);
  }

  beforeAll(async () => {
    cluster = await RedisCluster.start(1);
  });

  afterAll(async () => {
    await Promise.all(stores.splice(0).map((s) => s.health.close()));
    await cluster?.stop();
  });

  it('hears what another replica publishes once waitUntilReady returns', async () => {
    // Each pair's subscriber lands on a replica about every other time: six pairs, one publish
    // each, and nothing written that would make the replicas show in `CLUSTER SLOTS`.
    for (let pair = 0; pair < 6; pair++) {
      const a = newStore();
      const b = newStore();
      expect(
        await Promise.all([a.health.waitUntilReady(5000), b.health.waitUntilReady(5000)]),
      ).toEqual([true, true]);
      const heard: string[] = [];
      b.bus.onReloadRequested((from) => heard.push(from));
      await a.bus.requestReload();
      await waitFor(() => heard.length > 0, {
        timeoutMs: 1000,
        what: `pair ${pair}'s reload request`,
      });
      await Promise.all(stores.splice(0).map((s) => s.health.close()));
    }
  });

  // Last: it kills a node for good.
  it("re-reads when its subscriber's node dies, and hears again afterwards", async () => {
    // No pings: a command failing while the cluster is down would fire the recovery by itself.
    const b = newStore(60_000);
    expect(await b.health.waitUntilReady(5000)).toBe(true);
    const subscriberNode = await waitFor(
      async () => {
        for (const node of cluster.servers) {
          const clients = String(await adminCommand(node.address, 'CLIENT', 'LIST'));
          if (/ name=\S*token-broker-subscriber .* cmd=subscribe /.test(clients)) return node;
        }
        return undefined;
      },
      { timeoutMs: 3000, what: "the node of b's subscriber" },
    );
    const a = newStore();
    expect(await a.health.waitUntilReady(5000)).toBe(true);
    let recovered = 0;
    b.health.onRecovered(() => recovered++);
    const heard: string[] = [];
    b.bus.onReloadRequested((from) => heard.push(from));

    await subscriberNode.stop();
    await waitFor(() => recovered > 0, { timeoutMs: 10_000, what: 'b to re-read' });
    await waitFor(
      async () => {
        await a.bus.requestReload().catch(() => undefined);
        return heard.length > 0;
      },
      { timeoutMs: 10_000, intervalMs: 200, what: "b to hear a's reload request" },
    );
  });
});
