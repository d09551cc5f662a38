import pino from 'pino';
import { forwardSettingsSchema } from '../src/config/provider.schema';
import { redisSettingsSchema } from '../src/config/redis.schema';
import type { ForwardRateLimiter } from '../src/forwarding/forward-rate-limiter';
import { RedisForwardRateLimiter } from '../src/redis/forward-rate-limiter.redis';
import { createRedisConnection, type RedisClient } from '../src/redis/redis.connection';
import { StandaloneRedis } from './support/redis/standalone';
import { type RedisTopology, startTopology, TOPOLOGY_KINDS } from './support/redis/topology';
import { waitFor } from './support/wait';

jest.setTimeout(120_000);

/**
 * The passthrough's limits on real Redis of each topology: two limiters on two connections
 * stand for two replicas sharing the counters.
 */
describe.each(TOPOLOGY_KINDS)(`${RedisForwardRateLimiter.name} on %s Redis`, (kind) => {
  let topology: RedisTopology;
  const connections: RedisClient[] = [];
  const logged: string[] = [];
  let client = 0;

  async function replica(limits: Record<string, number>): Promise<ForwardRateLimiter> {
    const settings = redisSettingsSchema.parse({ ...topology.settings(), commandTimeoutMs: 500 });
    const redis = createRedisConnection(settings, 'command');
    connections.push(redis);
    await waitFor(() => (redis.status === 'ready' ? true : undefined), {
      timeoutMs: 10_000,
      what: 'the Redis connection',
    });
    const logger = pino({ level: 'warn' }, { write: (line: string) => logged.push(line) });
    return new RedisForwardRateLimiter(redis, forwardSettingsSchema.parse(limits), logger);
  }

  /** Consumes `n` times, alternating between `limiters`; the verdicts in order. */
  async function consume(limiters: ForwardRateLimiter[], id: string, caller: string, n: number) {
    const verdicts = [];
    for (let i = 0; i < n; i++)
      verdicts.push(await limiters[i % limiters.length].consume(id, caller));
    return verdicts;
  }

  beforeAll(async () => {
    topology = await startTopology(kind);
  });
  afterEach(() => {
    for (const c of connections.splice(0)) c.disconnect();
  });
  afterAll(async () => {
    await topology?.stop();
  });

  it('shares the per-client limit between replicas, refusing with the time to wait', async () => {
    const limits = { clientRatePerSecond: 10, clientRateBurst: 0, callerRatePerSecond: 0 };
    const replicas = [await replica(limits), await replica(limits)];
    const id = `client-${kind}-${client++}`;
    const verdicts = await consume(replicas, id, 'checkout', 15);
    expect(verdicts.filter((v) => v.allowed)).toHaveLength(10);
    const refused = verdicts.filter((v) => !v.allowed);
    expect(refused).toHaveLength(5);
    for (const v of refused) {
      expect(v).toMatchObject({ allowed: false, scope: 'client', degraded: false });
      if (!v.allowed) expect(v.retryAfterMs).toBeGreaterThan(0);
    }
  });

  it('limits each caller on its own, and allows the burst above the rate', async () => {
    const limits = {
      clientRatePerSecond: 100,
      clientRateBurst: 0,
      callerRatePerSecond: 2,
      callerRateBurst: 3,
    };
    const replicas = [await replica(limits), await replica(limits)];
    const id = `client-${kind}-${client++}`;
    const a = await consume(replicas, id, 'checkout', 7);
    expect(a.map((v) => v.allowed)).toEqual([true, true, true, true, true, false, false]);
    expect(a[6]).toMatchObject({ scope: 'caller' });
    // Another caller of the same client is not held back by the first one's limit.
    const b = await consume(replicas, id, 'marketing', 2);
    expect(b.every((v) => v.allowed)).toBe(true);
  });

  // Killing a node of a Sentinel group or a Cluster is a failover, tested elsewhere.
  (kind === 'standalone' ? it : it.skip)(
    'counts in memory while Redis does not answer, and says so',
    async () => {
      if (!(topology instanceof StandaloneRedis) || !topology.redis.canControl) return;
      const limits = { clientRatePerSecond: 5, clientRateBurst: 0, callerRatePerSecond: 0 };
      const [limiter] = [await replica(limits)];
      await topology.redis.kill();
      try {
        const verdicts = await consume([limiter], `client-${kind}-${client++}`, 'checkout', 7);
        expect(verdicts.every((v) => v.degraded)).toBe(true);
        expect(verdicts.filter((v) => v.allowed)).toHaveLength(5);
        expect(logged.join('\n')).toMatch(/counted in this replica only/);
      } finally {
        await topology.redis.restart();
      }
    },
  );
});
