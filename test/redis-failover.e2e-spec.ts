import { redisSettingsSchema } from '../src/config/redis.schema';
import { idempotencyKeyHash } from '../src/forwarding/order-request';
import { RedisIdempotencyStore } from '../src/redis/idempotency-store.redis';
import { closeRedisClient, createRedisConnection } from '../src/redis/redis.connection';
import type { StateLogger } from '../src/redis/redis-state';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import { PlainTokenCipher } from '../src/token/token-cipher';
import { toRecord } from '../src/token/token-record';
import type { FaultProxy } from './support/fault-proxy';
import { type RedisCluster, startRedisCluster } from './support/redis/cluster';
import type { RedisNode } from './support/redis/node';
import { type SentinelGroup, startSentinelGroup } from './support/redis/sentinel';
import { type FixedEndpointPair, startFixedEndpointPair } from './support/redis/standalone';
import { waitFor } from './support/wait';

const CLIENT = 'acme-preprod';

/** A logger that keeps the store's transition lines. */
function recordingLogger(): StateLogger & { lines: Array<{ to: string; msg: string }> } {
  const lines: Array<{ to: string; msg: string }> = [];
  const log = (obj: unknown, msg?: string) => {
    lines.push({ to: String((obj as { to?: string }).to), msg: msg ?? '' });
  };
  return { lines, info: log, warn: log, error: log } as never;
}

/**
 * A failover behind a fixed endpoint (the ElastiCache primary endpoint, a Kubernetes Service in
 * front of whichever node is master): the client's connection stays open to the old master,
 * which now answers `READONLY`. The broker must reconnect, reach the new master through the
 * same endpoint, and write again within seconds, without a restart.
 */
describe('Redis failover behind a fixed endpoint (READONLY)', () => {
  let pair: FixedEndpointPair;
  let a: RedisNode;
  let b: RedisNode;
  let endpoint: FaultProxy;

  beforeAll(async () => {
    pair = await startFixedEndpointPair();
    [a, b] = pair.servers;
    endpoint = pair.proxy;
  });

  afterAll(async () => {
    await pair?.stop();
  });

  it('lands on the new master within seconds, logging one down/up transition', async () => {
    const settings = redisSettingsSchema.parse({
      url: endpoint.url('redis'),
      commandTimeoutMs: 500,
      pingIntervalMs: 100,
    });
    const logger = recordingLogger();
    const store = new RedisTokenStore(
      createRedisConnection(settings, 'command'),
      createRedisConnection(settings, 'subscriber'),
      new PlainTokenCipher(),
      settings,
      1000,
      [CLIENT],
      logger,
    );
    const ordersConnection = createRedisConnection(settings, 'command');
    ordersConnection.on('error', () => undefined);
    const orders = new RedisIdempotencyStore(ordersConnection, new PlainTokenCipher());
    try {
      expect(await store.health.waitUntilReady(5000)).toBe(true);
      let expiresAt = Date.now() + 60_000;
      const write = () => {
        expiresAt += 1;
        return store.records.writeFenced(
          CLIENT,
          toRecord({ accessToken: `t${expiresAt}`, obtainedAt: Date.now(), expiresAt }),
        );
      };
      expect(await write()).toBe(true);
      await waitFor(() => ordersConnection.status === 'ready', {
        timeoutMs: 5000,
        what: 'the orders connection',
      });
      const claim = (key: string) =>
        orders.claim(
          { clientId: CLIENT, caller: 'checkout', keyHash: idempotencyKeyHash(key) },
          { bodyHash: 'b'.repeat(64), owner: key, leaseMs: 5000 },
          60_000,
        );
      expect(await claim('before')).toEqual({ claimed: true });
      const connectionsBefore = endpoint.stats.connectionsAccepted;

      // The failover: B becomes master, the endpoint follows it, A becomes B's replica. The
      // broker's connections through the endpoint stay open to A.
      await b.cli('REPLICAOF', 'NO', 'ONE');
      endpoint.retarget({ host: '127.0.0.1', port: b.port });
      await a.cli('REPLICAOF', '127.0.0.1', String(b.port));
      const failedOver = Date.now();
      await waitFor(async () => (await a.cli('ROLE')).startsWith('slave'), {
        timeoutMs: 5000,
        what: 'A to be a replica',
      });

      // Writes fail (READONLY, then a reconnection) and succeed again through the same endpoint.
      await waitFor(() => write().catch(() => false), {
        timeoutMs: 10_000,
        intervalMs: 50,
        what: 'a token write to succeed on the new master',
      });
      const tokenRecoveryMs = Date.now() - failedOver;
      await waitFor(
        () =>
          claim(`after-${Date.now()}`)
            .then((r) => r.claimed)
            .catch(() => false),
        { timeoutMs: 10_000, intervalMs: 50, what: 'an idempotency claim on the new master' },
      );
      const ordersRecoveryMs = Date.now() - failedOver;
      process.stdout.write(
        `READONLY failover: token writes back after ${tokenRecoveryMs} ms, idempotency claims after ${ordersRecoveryMs} ms\n`,
      );
      expect(tokenRecoveryMs).toBeLessThan(5000);
      expect(ordersRecoveryMs).toBeLessThan(5000);
      // Really on B now: the new connections went there, and B holds what was just written.
      expect(endpoint.stats.connectionsAccepted).toBeGreaterThan(connectionsBefore);
      // (Compared by fingerprint: the stored expiry is in Redis's clock, not the writer's.)
      expect(await b.cli('HGET', `tb:{${CLIENT}}:token`, 'fp')).toBe(
        toRecord({ accessToken: `t${expiresAt}`, obtainedAt: 0, expiresAt }).fingerprint,
      );

      const transitions = logger.lines.map((l) => l.to);
      expect(transitions).toEqual(['up', 'down', 'up']);
    } finally {
      await store.health.close();
      await closeRedisClient(ordersConnection);
    }
  }, 30_000);
});

/** Writes through `store` until one succeeds; resolves with the time that took. */
async function timeUntilWritable(store: RedisTokenStore, client: string): Promise<number> {
  const started = Date.now();
  let expiresAt = Date.now() + 120_000;
  await waitFor(
    () => {
      expiresAt += 1;
      return store.records
        .writeFenced(
          client,
          toRecord({ accessToken: `t${expiresAt}`, obtainedAt: Date.now(), expiresAt }),
        )
        .then(() => true);
    },
    { timeoutMs: 20_000, intervalMs: 50, what: `a token write for ${client} after the failover` },
  );
  return Date.now() - started;
}

function topologyStore(raw: Record<string, unknown>, clients: string[], logger: StateLogger) {
  const settings = redisSettingsSchema.parse({
    commandTimeoutMs: 500,
    pingIntervalMs: 100,
    ...raw,
  });
  return new RedisTokenStore(
    createRedisConnection(settings, 'command'),
    createRedisConnection(settings, 'subscriber'),
    new PlainTokenCipher(),
    settings,
    1000,
    clients,
    logger,
  );
}

describe('Redis failover through Sentinel', () => {
  let group: SentinelGroup;

  beforeAll(async () => {
    group = await startSentinelGroup();
  }, 30_000);

  afterAll(async () => {
    await group?.stop();
  });

  it('follows the new master within seconds of a Sentinel failover', async () => {
    const logger = recordingLogger();
    const store = topologyStore(group.settings(), [CLIENT], logger);
    try {
      expect(await store.health.waitUntilReady(5000)).toBe(true);
      await timeUntilWritable(store, CLIENT);
      const replicas = group.servers.slice(1);
      await waitFor(
        async () => {
          const infos = await Promise.all(replicas.map((r) => r.cli('INFO', 'replication')));
          return infos.every((i) => i.includes('master_link_status:up'));
        },
        { timeoutMs: 10_000, what: 'the replicas to be in sync' },
      );
      const failoverStarted = Date.now();
      await group.sentinels[0].cli('SENTINEL', 'FAILOVER', group.masterName);
      const promoted = await waitFor(
        async () => {
          const roles = await Promise.all(replicas.map((r) => r.cli('ROLE')));
          return replicas.find((_, i) => roles[i].startsWith('master'));
        },
        { timeoutMs: 15_000, what: 'a replica to be promoted' },
      );
      const promotedAt = Date.now();
      const ms = await timeUntilWritable(store, CLIENT);
      process.stdout.write(
        `Sentinel failover: token writes back ${Date.now() - promotedAt} ms after the promotion, ${Date.now() - failoverStarted} ms after SENTINEL FAILOVER\n`,
      );
      expect(ms).toBeLessThan(10_000);
      // The store's writes land on the new master. Right after the promotion a write may still
      // reach the old master, which takes writes until a sentinel converts it: write again
      // until a newer token shows up on the promoted one.
      const key = `tb:{${CLIENT}}:token`;
      await waitFor(
        async () => {
          const before = await promoted.cli('HGET', key, 'fp');
          await timeUntilWritable(store, CLIENT);
          return (await promoted.cli('HGET', key, 'fp')) !== before;
        },
        { timeoutMs: 10_000, intervalMs: 100, what: "the store's writes on the new master" },
      );
    } finally {
      await store.health.close();
    }
  }, 60_000);
});

describe('Redis Cluster master failover', () => {
  let cluster: RedisCluster;

  beforeAll(async () => {
    cluster = await startRedisCluster();
  }, 60_000);

  afterAll(async () => {
    await cluster?.stop();
  });

  it('follows the promoted replica within seconds of a master crash', async () => {
    const clients = ['acme-a', 'acme-b', 'acme-c', 'acme-d'];
    const logger = recordingLogger();
    const store = topologyStore(cluster.settings(), clients, logger);
    try {
      expect(await store.health.waitUntilReady(5000)).toBe(true);
      for (const c of clients) await timeUntilWritable(store, c);
      // The master that owns the first client's slot, found by asking every node.
      const slot = await cluster.servers[0].cli('CLUSTER', 'KEYSLOT', `tb:{${clients[0]}}:token`);
      let victim: RedisNode | undefined;
      for (const node of cluster.servers) {
        const role = await node.cli('ROLE');
        if (!role.startsWith('master')) continue;
        if ((await node.cli('CLUSTER', 'COUNTKEYSINSLOT', slot)) !== '0') victim = node;
      }
      expect(victim).toBeDefined();
      await victim!.stop();
      const crashed = Date.now();
      const survivor = cluster.servers.find((n) => n !== victim)!;
      // Promoted: the victim is marked failed and the cluster serves every slot again.
      await waitFor(
        async () =>
          /master,fail /.test(await survivor.cli('CLUSTER', 'NODES')) &&
          (await survivor.cli('CLUSTER', 'INFO')).includes('cluster_state:ok'),
        { timeoutMs: 15_000, what: 'the cluster to promote a replica' },
      ).catch(async (err: unknown) => {
        throw new Error(`${String(err)}\n${await survivor.cli('CLUSTER', 'NODES')}`);
      });
      process.stdout.write(
        `Cluster master crash: replica promoted ${Date.now() - crashed} ms after the crash\n`,
      );
      const ms = await timeUntilWritable(store, clients[0]);
      process.stdout.write(
        `Cluster master crash: token writes back ${ms} ms after the promotion, ${Date.now() - crashed} ms after the crash\n`,
      );
      expect(Date.now() - crashed).toBeLessThan(15_000);
      // The other clients' slots never moved; they are writable too.
      for (const c of clients.slice(1)) await timeUntilWritable(store, c);
    } finally {
      await store.health.close();
    }
  }, 90_000);
});
