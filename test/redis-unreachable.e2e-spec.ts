import type { BrokerProcess } from './support/broker-process';
import { freePort } from './support/ports';
import { RedisNode } from './support/redis/node';
import { type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

const GRACE_MS = 10_000;

/**
 * A replica whose Redis is unreachable, from start-up or later: it says so once in a JSON log
 * line without any traffic, writes nothing but JSON, and SIGTERM stops it promptly with exit
 * code 0. Real broker processes; the closed port is a free loopback port nobody listens on.
 */
describe('Redis unreachable', () => {
  let stack: Stack;
  const brokers: BrokerProcess[] = [];
  const nodes: RedisNode[] = [];

  beforeAll(async () => {
    stack = await startStack({
      name: 'redis-unreachable',
      clients: ['acme-preprod'],
      // A key file: reading it delays the token store (and its error listener) past the
      // connection's first error, the window in which ioredis printed a raw line.
      cacheKey: true,
      replicas: 0,
      env: { LOG_LEVEL: 'info', SHUTDOWN_GRACE_MS: String(GRACE_MS) },
    });
  });

  afterEach(async () => {
    await Promise.all(brokers.splice(0).map((b) => b.kill()));
    await Promise.all(nodes.splice(0).map((n) => n.stop()));
  });

  afterAll(async () => {
    await stack?.close();
  });

  /** A broker process on `redisUrl`, not awaited: the tests wait for what they look at. */
  async function broker(redisUrl: string): Promise<BrokerProcess> {
    const b = await stack.addBroker({ env: { REDIS_URL: redisUrl }, wait: 'none' });
    brokers.push(b.process!);
    return b.process!;
  }

  /** Parsed log lines; fails naming the first line that is not a JSON object. */
  function jsonLines(b: BrokerProcess): Array<Record<string, unknown>> {
    return b.logs().map((line) => {
      try {
        const parsed: unknown = JSON.parse(line);
        if (typeof parsed !== 'object' || parsed === null) throw new Error('not an object');
        return parsed as Record<string, unknown>;
      } catch {
        throw new Error(`a log line is not JSON: ${line}`);
      }
    });
  }

  /** The JSON lines with a message starting with `msg` (and `to`, when given). */
  function logged(b: BrokerProcess, msg: string, to?: string): Array<Record<string, unknown>> {
    return b
      .logs()
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as Record<string, unknown>)
      .filter((l) => String(l.msg).startsWith(msg) && (to === undefined || l.to === to));
  }

  /** SIGTERM; resolves with the exit code and how long the exit took. */
  async function terminate(b: BrokerProcess): Promise<{ code: number | null; ms: number }> {
    const started = Date.now();
    const exit = await b.stop(GRACE_MS + 5000);
    return { code: exit.code, ms: Date.now() - started };
  }

  it('started with Redis down: SIGTERM exits 0 at once, not after the grace period', async () => {
    const b = await broker(`redis://127.0.0.1:${await freePort()}`);
    await b.waitReady();

    const { code, ms } = await terminate(b);
    // The bug: the subscriber's QUIT waited behind its queued SUBSCRIBE for a Redis that never
    // answered, using the whole grace period, then exit 1. Closing takes milliseconds.
    expect({ code, ms: ms < 3000 }).toEqual({ code: 0, ms: true });
    expect(logged(b, 'shutdown grace period exceeded')).toHaveLength(0);
    expect(logged(b, 'stopped')).toHaveLength(1);
  }, 30_000);

  it('started with Redis down: warns once within seconds without traffic, and writes only JSON', async () => {
    const b = await broker(`redis://127.0.0.1:${await freePort()}`);
    // No request of any kind (not even readiness): the warning must come by itself.
    const [warning] = await waitFor(
      () => {
        const found = logged(b, 'Redis unreachable', 'down');
        return found.length > 0 ? found : undefined;
      },
      // Generous for a loaded machine; the log's own times are what is measured.
      { timeoutMs: 20_000, intervalMs: 50, what: 'the "Redis unreachable" warning' },
    );
    // Within seconds of the process's first line (the first connection attempt fails at once).
    const [first] = logged(b, '');
    expect(Date.parse(String(warning.time)) - Date.parse(String(first.time))).toBeLessThan(3000);
    expect(warning.level).toBe('warn');
    expect(String(warning.reason)).toContain('ECONNREFUSED');
    await waitFor(() => logged(b, 'token broker listening').length > 0, {
      timeoutMs: 10_000,
      what: 'the broker to listen',
    });
    // Several reconnection attempts later (they are at most 2 s apart), still one line.
    await new Promise((r) => setTimeout(r, 2500));
    expect(logged(b, 'Redis unreachable', 'down')).toHaveLength(1);
    await terminate(b);
    // Every line, stdout and stderr, is JSON (no raw "[ioredis] Unhandled error event").
    expect(jsonLines(b).length).toBeGreaterThan(0);
  }, 30_000);

  it('Redis lost after start: warns without traffic, and SIGTERM still exits 0 at once', async () => {
    const node = await RedisNode.start();
    nodes.push(node);
    const b = await broker(`redis://${node.address}`);
    await b.waitReady();
    await waitFor(() => logged(b, 'Redis connected').length > 0, {
      timeoutMs: 5000,
      what: 'the "Redis connected" line',
    });

    await node.stop();
    nodes.splice(0);
    const lost = Date.now();
    await waitFor(() => logged(b, 'Redis unreachable', 'down').length > 0, {
      timeoutMs: 10_000,
      intervalMs: 50,
      what: 'the "Redis unreachable" warning',
    });
    expect(Date.now() - lost).toBeLessThan(5000);

    const { code, ms } = await terminate(b);
    expect(code).toBe(0);
    expect(ms).toBeLessThan(3000);
    expect(logged(b, 'Redis unreachable', 'down')).toHaveLength(1);
    expect(jsonLines(b).map((l) => l.msg)).toContain('stopped');
  }, 30_000);
});
