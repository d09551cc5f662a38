import { Redis } from 'ioredis';
import { redisKeys } from '../src/redis/redis.constants';
import { FLEET_CLIENT } from './support/fleet';
import { startRedis, type TestRedis } from './support/redis/standalone';
import { type Stack, startStack } from './support/stack';
import { metricValue } from './support/token-watch';
import { waitFor } from './support/wait';

/**
 * Idempotency lives in Redis: if Redis loses its data, the broker cannot know that an order was
 * already answered. It cannot undo that either, so every replica must notice and say so: a
 * metric the chart alerts on and an error log, against a real Redis restarted empty.
 */
describe('a fleet whose Redis restarts empty', () => {
  let redis: TestRedis;
  let fleet: Stack;
  let raw: Redis;

  // Two broker processes, as a Redis fault is seen by a fleet.
  beforeAll(async () => {
    redis = await startRedis();
    fleet = await startStack({
      name: 'redis-data-loss',
      clients: [FLEET_CLIENT],
      redis,
      replicas: 2,
      env: { LOG_LEVEL: 'warn', REDIS_PING_INTERVAL_MS: '200' },
    });
    raw = new Redis(redis.url, { maxRetriesPerRequest: 1, lazyConnect: true });
  });

  afterAll(async () => {
    raw?.disconnect();
    await fleet?.close();
    await redis?.stop();
  });

  it('counts the loss on every replica and logs what it means', async () => {
    const loss = (url: string) => metricValue(url, 'token_broker_redis_data_loss_total');
    // Every replica has seen the marker at least twice: the data is there, nothing counted.
    await raw.connect();
    await waitFor(async () => Number(await raw.hget(redisKeys.epoch(FLEET_CLIENT), 'seq')) >= 4, {
      timeoutMs: 5000,
      what: 'both replicas to check continuity',
    });
    for (const b of fleet.brokers) expect(await loss(b.url)).toBe(0);

    await redis.restart();

    for (const b of fleet.brokers) {
      await waitFor(async () => (await loss(b.url)) >= 1, {
        timeoutMs: 10_000,
        what: `${b.name} to notice the loss`,
      });
    }
    const lossLinesOf = (b: (typeof fleet.brokers)[number]) =>
      b.logs().filter((l) => l.includes('Redis lost its data'));
    // Logs leave in batches: wait for the line rather than expect it at once.
    for (const b of fleet.brokers) {
      await waitFor(() => lossLinesOf(b).length > 0, {
        timeoutMs: 5000,
        what: `${b.name}'s error log line`,
      });
    }
    const counts = await Promise.all(fleet.brokers.map((b) => loss(b.url)));
    const lossLines = fleet.brokers.map((b) => lossLinesOf(b).length);
    console.log(
      `[redis-data-loss] lossCountedPerReplica=${counts.join(',')} errorLogLines=${lossLines.join(',')}`,
    );
    // Once per replica: the new epoch is then the one they remember.
    expect(counts).toEqual([1, 1]);
    expect(lossLines).toEqual([1, 1]);
    for (const b of fleet.brokers) {
      const [line] = lossLinesOf(b);
      expect(line).toContain('"level":"error"');
      expect(line).toContain('"continuity":"lost"');
      expect(line).toContain('second order');
    }
    // The fleet carries on: a token is served again.
    const res = await fetch(`${fleet.brokers[0].url}/token?client=${FLEET_CLIENT}`);
    expect(res.status).toBe(200);
  });
});
