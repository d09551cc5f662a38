import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { redisSettingsSchema } from '../src/config/redis.schema';
import { redisKeys } from '../src/redis/redis.constants';
import { createRedisConnection } from '../src/redis/redis.connection';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import { AesGcmTokenCipher } from '../src/token/aes-gcm-token.cipher';
import { type TokenRecord, toRecord } from '../src/token/token-record';
import type { TokenStoreEvent } from '../src/token/token-store';
import { type RedisTopology, startTopology, TOPOLOGY_KINDS } from './support/redis/topology';
import { waitFor } from './support/wait';

const CLIENTS = 1000;

/** The masters of `raw`: every node of a Cluster that serves slots, else the one server. */
async function masters(raw: Redis | Cluster): Promise<Redis[]> {
  return raw.isCluster ? (raw as Cluster).nodes('master') : [raw as Redis];
}

/** Top-level script calls since the last reset, on every master (a script's own calls excluded). */
async function scriptCalls(raw: Redis | Cluster): Promise<number> {
  let calls = 0;
  for (const node of await masters(raw)) {
    const stats = await node.info('commandstats');
    for (const m of stats.matchAll(/^cmdstat_(evalsha|eval):calls=(\d+)/gm)) calls += Number(m[2]);
  }
  return calls;
}

async function resetStats(raw: Redis | Cluster): Promise<void> {
  for (const node of await masters(raw)) await node.config('RESETSTAT');
}

function record(token: string): TokenRecord {
  const now = Date.now();
  return toRecord({ accessToken: token, obtainedAt: now, expiresAt: now + 600_000 });
}

/** How a replica that joins reads every client's stored token: per node, a few commands. */
describe.each(TOPOLOGY_KINDS)('readMany on %s Redis', (kind) => {
  let topology: RedisTopology;
  let raw: Redis | Cluster;
  let store: RedisTokenStore;
  const ids = Array.from({ length: CLIENTS }, (_, i) => `merchant-${i}`);

  beforeAll(async () => {
    topology = await startTopology(kind);
    raw = topology.client();
    // A long ping interval: the health probe's scripts must not count as reads.
    const settings = redisSettingsSchema.parse({
      ...topology.settings(),
      commandTimeoutMs: 2000,
      pingIntervalMs: 60_000,
    });
    store = new RedisTokenStore(
      createRedisConnection(settings, 'command'),
      createRedisConnection(settings, 'subscriber'),
      new AesGcmTokenCipher(randomBytes(32)),
      settings,
      600,
      ids.slice(0, 1),
    );
    expect(await store.health.waitUntilReady(5000)).toBe(true);
  }, 120_000);

  afterAll(async () => {
    await store?.health.close();
    await topology?.stop();
  });

  it(`reads ${CLIENTS} clients in a few script calls, each found, absent or corrupt as read() says`, async () => {
    const written = new Map<string, TokenRecord>();
    // Every client but the last 100 has a token; 10 of those are garbled afterwards.
    for (const id of ids.slice(0, CLIENTS - 100)) {
      const r = record(`token-of-${id}`);
      expect(await store.records.writeFenced(id, r)).toBe(true);
      written.set(id, r);
    }
    const corrupt = ids.slice(0, 10);
    for (const id of corrupt.slice(0, 5)) await raw.hset(redisKeys.token(id), 'val', 'garbled');
    for (const id of corrupt.slice(5)) {
      await raw.del(redisKeys.token(id));
      await raw.set(redisKeys.token(id), 'not a hash');
    }

    await resetStats(raw);
    const found = await store.records.readMany(ids);
    const calls = await scriptCalls(raw);

    // Standalone and Sentinel: one node, 2 chunks of 500; a Cluster: one per master.
    expect(calls).toBeGreaterThan(0);
    expect(calls).toBeLessThanOrEqual(kind === 'cluster' ? 6 : 4);
    expect(found.size).toBe(CLIENTS);
    for (const id of ids) {
      const one = await store.records.read(id);
      expect({ id, stored: found.get(id) }).toEqual({ id, stored: one });
    }
    for (const id of corrupt) expect(found.get(id)).toEqual({ status: 'corrupt' });
    for (const id of ids.slice(CLIENTS - 100)) expect(found.get(id)).toEqual({ status: 'absent' });
    for (const id of ids.slice(10, CLIENTS - 100)) {
      expect(found.get(id)).toEqual({ status: 'found', record: written.get(id) });
    }
    // A corrupt value read this way is discarded as after read().
    await store.records.readMany(corrupt);
    for (const id of corrupt) await store.records.discardCorrupt(id);
    for (const id of corrupt) expect(await raw.exists(redisKeys.token(id))).toBe(0);
  }, 120_000);

  it('follows the clients a reload adds, and no longer the ones it removes', async () => {
    const seen: TokenStoreEvent[] = [];
    store.records.onEvent((e) => seen.push(e));
    await store.records.follow([ids[0], 'newcomer']);
    // Confirmed by Redis once `follow` resolves: a write now reaches this store.
    await store.records.writeFenced('newcomer', record('token-of-newcomer'));
    await waitFor(() => seen.some((e) => e.clientId === 'newcomer'), {
      timeoutMs: 3000,
      what: "the newcomer's event",
    });
    await store.records.follow([ids[0]]);
    seen.length = 0;
    await store.records.writeFenced('newcomer', record('another-token-of-newcomer'));
    await store.records.writeFenced(ids[0], record(`newer-token-of-${ids[0]}`));
    await waitFor(() => seen.some((e) => e.clientId === ids[0]), {
      timeoutMs: 3000,
      what: `the event of ${ids[0]}`,
    });
    expect(seen.filter((e) => e.clientId === 'newcomer')).toEqual([]);
  });
});
