import type { Redis } from 'ioredis';
import { startTopology, type RedisTopology } from './support/redis/topology';
import { type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

const CLIENTS = 400;

/** The addresses (`host:port`) of the connections Redis has now. */
async function connections(redis: Redis): Promise<Set<string>> {
  const list = String(await redis.client('LIST'));
  return new Set([...list.matchAll(/ addr=(\S+) /g)].map((m) => m[1]));
}

/**
 * A replica that joins a fleet adopts every client's stored token with a few commands (one
 * script per 500 clients), not one read per client, and asks the provider for none.
 */
describe(`a replica joining a fleet of ${CLIENTS} clients`, () => {
  let topology: RedisTopology;
  let stack: Stack;
  const ids = Array.from({ length: CLIENTS }, (_, i) => `shop-${i}-prod`);

  beforeAll(async () => {
    topology = await startTopology('standalone');
    stack = await startStack({
      name: 'join',
      clients: ids,
      redis: topology,
      replicas: 1,
      env: { LOG_LEVEL: 'warn', REDIS_PING_INTERVAL_MS: '1000' },
    });
  }, 180_000);

  afterAll(async () => {
    await stack?.close();
    await topology?.stop();
  });

  it('sends a handful of Redis commands and no token request', async () => {
    const first = stack.broker;
    // The first replica fetches (and stores) every client's token, the start-up burst queueing.
    for (const id of ids) {
      await waitFor(async () => (await fetch(`${first.url}/token?client=${id}`)).status === 200, {
        timeoutMs: 30_000,
        what: `a token of ${id} on the first replica`,
      });
    }
    const requestsBefore = stack.provider.stats.tokenRequests;
    expect(requestsBefore).toBe(CLIENTS);

    const raw = topology.client() as Redis;
    const known = await connections(raw);
    const monitor = await raw.monitor();
    const joinerCommands: string[] = [];
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      // Commands a script runs show as `lua`; the first replica's and this test's are known.
      if (source === 'lua' || known.has(source)) return;
      joinerCommands.push(String(args[0]).toLowerCase());
    });
    const second = await stack.addBroker();
    // Every client served from what it adopted at start: nothing read, nothing fetched.
    for (const id of ids) {
      const res = await fetch(`${second.url}/token?client=${id}`);
      expect(res.status).toBe(200);
    }
    monitor.disconnect();

    const reads = joinerCommands.filter((c) => ['evalsha', 'eval', 'get', 'hmget'].includes(c));
    // Measured: 5 scripts (the one read, the health probe and the continuity marker each
    // second, EVAL before a SHA is loaded), SUBSCRIBE, CLIENT and INFO: 10 commands in all.
    // Without the read at start it was 403 scripts, one per client.
    expect(reads.length).toBeLessThan(20);
    expect(joinerCommands.length).toBeLessThan(40);
    expect(stack.provider.stats.tokenRequests).toBe(requestsBefore);
  }, 180_000);
});
