import type { RedisSettings } from '../src/config/config.schema';
import { redisSettingsSchema } from '../src/config/redis.schema';
import { RedisIdempotencyStore } from '../src/redis/idempotency-store.redis';
import {
  closeRedisClient,
  createRedisConnection,
  type RedisClient,
} from '../src/redis/redis.connection';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import { idempotencyKeyHash } from '../src/forwarding/order-request';
import { PlainTokenCipher } from '../src/token/token-cipher';
import { toRecord } from '../src/token/token-record';
import type { TokenStoreEvent } from '../src/token/token-store';
import { type RedisCluster, startRedisCluster } from './support/redis/cluster';
import { type SentinelGroup, startSentinelGroup } from './support/redis/sentinel';
import { startTopology, type RedisTopology } from './support/redis/topology';
import { holdRefreshLock } from './support/refresh-lock';
import { waitFor } from './support/wait';

/** Several clients, so that on the cluster their hash tags land on different masters. */
const CLIENTS = ['acme-a', 'acme-b', 'acme-c', 'acme-d'];

/**
 * The same store operations through each topology's connection: a standalone server, a
 * Sentinel-managed master, a Redis Cluster. What must work everywhere: the Lua scripts (one
 * hash slot each), redlock, and pub/sub between replicas.
 */
describe('Redis topologies', () => {
  let standalone: RedisTopology;
  let sentinel: SentinelGroup;
  let cluster: RedisCluster;
  const closers: Array<() => Promise<unknown>> = [];

  beforeAll(async () => {
    [standalone, sentinel, cluster] = await Promise.all([
      startTopology('standalone'),
      startSentinelGroup(),
      // No replicas: what is checked here is the masters' work, and nothing fails over.
      startRedisCluster(0),
    ]);
  }, 60_000);

  afterEach(async () => {
    await Promise.allSettled(closers.splice(0).map((c) => c()));
  });

  afterAll(async () => {
    await Promise.allSettled([standalone?.stop(), sentinel?.stop(), cluster?.stop()]);
  });

  const topologies: Array<[string, () => RedisSettings]> = [
    ['standalone', () => settingsFor(standalone.settings())],
    ['sentinel', () => settingsFor(sentinel.settings())],
    ['cluster', () => settingsFor(cluster.settings())],
  ];

  function newStore(settings: RedisSettings): RedisTokenStore {
    const store = new RedisTokenStore(
      createRedisConnection(settings, 'command'),
      createRedisConnection(settings, 'subscriber'),
      new PlainTokenCipher(),
      settings,
      1000,
      CLIENTS,
    );
    closers.push(() => store.health.close());
    return store;
  }

  it.each(topologies)(
    '%s: scripts, lock, pub/sub and idempotency work for every client',
    async (_mode, settingsOf) => {
      const settings = settingsOf();
      const writer = newStore(settings);
      const listener = newStore(settings);
      expect(await writer.health.waitUntilReady(10_000)).toBe(true);
      expect(await listener.health.waitUntilReady(10_000)).toBe(true);
      const events: TokenStoreEvent[] = [];
      listener.records.onEvent((e) => events.push(e));

      const now = Date.now();
      for (const client of CLIENTS) {
        const record = toRecord({
          accessToken: `token-${client}`,
          obtainedAt: now,
          expiresAt: now + 60_000,
        });
        // The subscriber may still be subscribing: write until its event arrives. Each write
        // is a newer token, or the fence would refuse it and nothing would be published again.
        let attempt = 0;
        await waitFor(
          async () => {
            await writer.records.writeFenced(client, {
              ...record,
              expiresAt: record.expiresAt + attempt++,
            });
            return events.some((e) => e.clientId === client && e.type === 'updated');
          },
          { timeoutMs: 5000, intervalMs: 100, what: `the update event for ${client}` },
        );
        const read = await listener.records.read(client);
        expect(read.status).toBe('found');
        const lock = await holdRefreshLock(writer, client);
        expect(lock).not.toBeNull();
        expect(await holdRefreshLock(listener, client)).toBeNull();
        await lock!.release();
      }

      const connection = createRedisConnection(settings, 'command');
      closers.push(() => closeRedisClient(connection));
      await waitForReady(connection);
      const idempotency = new RedisIdempotencyStore(connection, new PlainTokenCipher());
      for (const client of CLIENTS) {
        const ref = {
          clientId: client,
          caller: 'checkout',
          keyHash: idempotencyKeyHash(`order-${client}`),
        };
        const claim = { bodyHash: 'b'.repeat(64), owner: 'me', leaseMs: 5000 };
        expect(await idempotency.claim(ref, claim, 60_000)).toEqual({ claimed: true });
        const again = await idempotency.claim(ref, { ...claim, owner: 'other' }, 60_000);
        expect(again.claimed).toBe(false);
      }
    },
    30_000,
  );

  it('cluster: the clients really are spread over several masters', async () => {
    const slots = await Promise.all(
      CLIENTS.map((c) => cluster.servers[0].cli('CLUSTER', 'KEYSLOT', `tb:{${c}}:token`)),
    );
    const owners = new Set<string>();
    const shards = await cluster.servers[0].cli('CLUSTER', 'SLOTS');
    // `CLUSTER SLOTS` lines: start, end, ip, port, id, ... per range.
    const lines = shards.split('\n');
    for (const slot of slots.map(Number)) {
      for (let i = 0; i + 3 < lines.length; i++) {
        const start = Number(lines[i]);
        const end = Number(lines[i + 1]);
        if (/^\d+$/.test(lines[i]) && /^\d+$/.test(lines[i + 1]) && lines[i + 2] === '127.0.0.1') {
          if (slot >= start && slot <= end) owners.add(lines[i + 3]);
        }
      }
    }
    expect(owners.size).toBeGreaterThan(1);
  });
});

function settingsFor(raw: Record<string, unknown>): RedisSettings {
  return redisSettingsSchema.parse({ commandTimeoutMs: 1000, pingIntervalMs: 200, ...raw });
}

async function waitForReady(client: RedisClient): Promise<void> {
  client.on('error', () => undefined);
  await waitFor(() => client.status === 'ready', {
    timeoutMs: 10_000,
    what: 'the Redis connection to be ready',
  });
}
