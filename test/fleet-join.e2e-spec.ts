import type { Cluster, Redis } from 'ioredis';
import { type RedisTopology, startTopology, TOPOLOGY_KINDS } from './support/redis/topology';
import { type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

const CLIENTS = 400;

/** The masters: every node of a Cluster that serves slots, else the one server. */
function masters(raw: Redis | Cluster): Redis[] {
  return raw.isCluster ? (raw as Cluster).nodes('master') : [raw as Redis];
}

/** The addresses (`host:port`) of the brokers' connections the masters have now. */
/**
 * `node.monitor()`, but robust: ioredis enters monitor mode a microtask after MONITOR's `OK`, so
 * a line that arrives in the same packet (another connection's command) is taken for a reply to
 * no command, and `monitor()` rejects with "Command queue state error". Those lines come before
 * the joiner starts and are not counted; any other error fails the test.
 */
function monitorOf(node: Redis): Promise<Redis> {
  const monitor = node.duplicate({ monitor: true, lazyConnect: false });
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => {
      if (err.message.startsWith('Command queue state error')) return;
      monitor.disconnect();
      reject(err);
    };
    monitor.on('error', onError);
    monitor.once('monitoring', () => resolve(monitor));
  });
}

async function brokerConnections(raw: Redis | Cluster): Promise<Set<string>> {
  const found = new Set<string>();
  for (const node of masters(raw)) {
    const list = String(await node.client('LIST'));
    for (const m of list.matchAll(/ addr=(\S+) .*name=token-broker-/g)) found.add(m[1]);
  }
  return found;
}

/**
 * A replica that joins a fleet adopts every client's stored token with a few commands (one
 * script per 500 clients), not one read per client, and asks the provider for none.
 */
describe.each(TOPOLOGY_KINDS)(
  `a replica joining a fleet of ${CLIENTS} clients (%s Redis)`,
  (kind) => {
    let topology: RedisTopology;
    let stack: Stack;
    const ids = Array.from({ length: CLIENTS }, (_, i) => `shop-${i}-prod`);

    beforeAll(async () => {
      topology = await startTopology(kind);
      stack = await startStack({
        name: `join-${kind}`,
        clients: ids,
        redis: topology,
        replicas: 1,
        env: {
          LOG_LEVEL: 'warn',
          REDIS_PING_INTERVAL_MS: '1000',
          // The first replica's start-up burst is not what this measures: no endpoint rate cap
          // (its default, 20 a second, made the burst 20 s of each case's 21).
          TOKEN_ENDPOINT_RATE_PER_SECOND: '0',
        },
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

      const raw = topology.client();
      const before = await brokerConnections(raw);
      const seen: { source: string; args: string[] }[] = [];
      const monitors = await Promise.all(masters(raw).map(monitorOf));
      for (const monitor of monitors) {
        monitor.on('monitor', (_time: string, args: string[], source: string) =>
          seen.push({ source, args }),
        );
      }
      const second = await stack.addBroker();
      // Every client served from what it adopted at start: nothing read, nothing fetched.
      for (const id of ids) {
        const res = await fetch(`${second.url}/token?client=${id}`);
        expect(res.status).toBe(200);
      }
      for (const monitor of monitors) monitor.disconnect();
      // The joiner's connections: the brokers' that were not there before it.
      const joiner = [...(await brokerConnections(raw))].filter((a) => !before.has(a));
      expect(joiner.length).toBeGreaterThan(0);
      // Commands a script runs show as `lua`, not as the connection's.
      const joinerCommands = seen.filter((c) => joiner.includes(c.source));
      /** Scripts that read a token record: `read` (token, gen) and `readMany` (one token key). */
      const tokenReads = joinerCommands.filter(({ args }) => {
        const [command, , keys, first, second] = args.map(String);
        return (
          command.toLowerCase().startsWith('eval') &&
          first.endsWith(':token') &&
          (keys === '1' || (keys === '2' && second.endsWith(':gen')))
        );
      }).length;

      // Measured: 1 read per master (standalone and Sentinel 1, Cluster 3); the joiner's other
      // commands are the health probe and continuity marker each second (one per master), EVAL
      // before a SHA is loaded, SUBSCRIBE, CLIENT, INFO (and a Cluster's CLUSTER SLOTS): 10 in
      // all on standalone and Sentinel, 34 on a 3-master Cluster. Without the read at start:
      // 403 scripts on standalone, one per client.
      const nodes = masters(raw).length;
      expect(tokenReads).toBeLessThanOrEqual(2 * nodes);
      expect(joinerCommands.length).toBeLessThan(20 * nodes);
      expect(stack.provider.stats.tokenRequests).toBe(requestsBefore);
    }, 180_000);
  },
);
