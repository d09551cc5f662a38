import { Redis } from 'ioredis';
import type { StartedTestContainer } from 'testcontainers';
import { FaultProxy } from '../fault-proxy';
import { hostProcess } from '../managed-process';
import { freePort } from '../ports';
import { waitFor } from '../wait';
import {
  acceptsWrites,
  adminCommand,
  errorMessage,
  HOST,
  info,
  RedisNode,
  SETTLE_TIMEOUT_MS,
  track,
  waitForReplicaLink,
} from './node';
import type { RedisTopology, Switch, TopologySettings } from './topology';

/** Where a {@link TestRedis} comes from. */
export type RedisKind = 'external' | 'container' | 'process';

/**
 * A Redis for one test file. Obtain it with {@link startRedis}; call {@link TestRedis.stop}
 * in `afterAll`.
 */
export interface TestRedis {
  /** `redis://host:port` (or `REDIS_URL` verbatim for an external Redis). */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly kind: RedisKind;
  /**
   * Whether {@link TestRedis.kill} and {@link TestRedis.restart} work. `false` for an external
   * Redis (`REDIS_URL`): outage tests should skip themselves then.
   */
  readonly canControl: boolean;
  /** Deletes every key (FLUSHALL). With `REDIS_URL`, that is every key of *that* server. */
  flush(): Promise<void>;
  /** Kills Redis abruptly (SIGKILL, like a crashed node) and resolves once it is gone. */
  kill(): Promise<void>;
  /** Stops Redis (it keeps no data); a no-op for an external Redis, which is not ours to stop. */
  stop(): Promise<void>;
  /**
   * Starts Redis again on the same port with no data (killing it first if it still runs), and
   * resolves once it answers: clients configured with {@link TestRedis.url} reconnect.
   */
  restart(): Promise<void>;
  /** Whether the server is running, as far as this helper knows (always true when external). */
  isRunning(): boolean;
}

/** Options for {@link startRedis}. */
export interface StartRedisOptions {
  /**
   * Ignore `REDIS_URL` and container runtimes and always run a local `redis-server` process:
   * for tests that must kill and restart Redis quickly.
   * @default false
   */
  forceLocal?: boolean;
}

/** Image for the testcontainers path: the major version the broker is built against. */
const REDIS_IMAGE = 'redis:7-alpine';
/** How long a container runtime may take to answer before we decide there is none. */
const RUNTIME_PROBE_TIMEOUT_MS = 3_000;

/**
 * Provides a Redis, in the order the project's test policy prescribes:
 * 1. `REDIS_URL` if set (e.g. a CI service container): used as is, `canControl` is false;
 * 2. a `redis:7-alpine` container via testcontainers, if a container runtime answers;
 * 3. a `redis-server` process on a free loopback port, with persistence off.
 *
 * It never falls back to a Redis on the default port: another one may run there (a developer's
 * or a shared one) and tests must not flush it.
 */
export async function startRedis(opts: StartRedisOptions = {}): Promise<TestRedis> {
  const externalUrl = process.env.REDIS_URL;
  if (!opts.forceLocal && externalUrl) return new ExternalRedis(externalUrl);
  if (!opts.forceLocal && (await containerRuntimeAvailable())) {
    try {
      return await ContainerRedis.start();
    } catch (err) {
      // A runtime that answers but cannot pull or run the image (offline CI runner) should not
      // fail the suite when a local redis-server can do the job; say so, though.
      process.stderr.write(
        `startRedis: container start failed (${errorMessage(err)}); using a local redis-server\n`,
      );
    }
  }
  return new ProcessRedis(await RedisNode.start());
}

/** A Redis given by `REDIS_URL`: shared, not ours to kill. */
class ExternalRedis implements TestRedis {
  readonly kind = 'external';
  readonly canControl = false;
  readonly host: string;
  readonly port: number;

  constructor(readonly url: string) {
    const parsed = new URL(url);
    this.host = parsed.hostname;
    this.port = Number(parsed.port || 6379);
  }

  async flush(): Promise<void> {
    await adminCommand(this.url, 'FLUSHALL');
  }

  async kill(): Promise<void> {
    throw notControllable('kill');
  }

  async stop(): Promise<void> {
    // Not ours: leave it running for whoever provided it.
  }

  async restart(): Promise<void> {
    throw notControllable('restart');
  }

  isRunning(): boolean {
    return true;
  }
}

/** A `redis-server` child process on a loopback port. */
class ProcessRedis implements TestRedis {
  readonly kind = 'process';
  readonly canControl = true;
  readonly host = HOST;
  readonly url: string;
  readonly port: number;

  constructor(private node: RedisNode) {
    this.port = node.port;
    this.url = `redis://${node.address}`;
  }

  async flush(): Promise<void> {
    await adminCommand(this.url, 'FLUSHALL');
  }

  async kill(): Promise<void> {
    await this.node.stop();
  }

  async stop(): Promise<void> {
    await this.node.stop();
  }

  async restart(): Promise<void> {
    await this.node.stop();
    // Same port, so clients that hold the URL reconnect. Redis binds with SO_REUSEADDR, so the
    // killed instance's TIME_WAIT sockets do not block it.
    this.node = await RedisNode.start([], { port: this.port });
  }

  isRunning(): boolean {
    return this.node.isRunning();
  }
}

/** A Redis container; the host port is fixed so that a restarted container keeps it. */
class ContainerRedis implements TestRedis {
  readonly kind = 'container';
  readonly canControl = true;
  readonly url: string;
  private running = true;

  private constructor(
    private container: StartedTestContainer,
    readonly host: string,
    readonly port: number,
  ) {
    this.url = `redis://${host}:${port}`;
  }

  static async start(): Promise<ContainerRedis> {
    const port = await freePort();
    const container = await startContainer(port);
    const redis = new ContainerRedis(container, container.getHost(), port);
    await redis.waitForPing();
    return redis;
  }

  async flush(): Promise<void> {
    await adminCommand(this.url, 'FLUSHALL');
  }

  async kill(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    // timeout 0: Docker sends SIGKILL straight away, like a crashed node.
    await this.container.stop({ timeout: 0 });
  }

  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    await this.container.stop({ timeout: 5000 });
  }

  async restart(): Promise<void> {
    await this.kill();
    // A new container rather than `docker restart`: it starts empty, like the process variant,
    // and the fixed host binding gives it the same port.
    this.container = await startContainer(this.port);
    this.running = true;
    await this.waitForPing();
  }

  isRunning(): boolean {
    return this.running;
  }

  private async waitForPing(): Promise<void> {
    // Only PONG counts: a Redis that is still loading answers `-LOADING`.
    await waitFor(() => adminCommand(this.url, 'PING'), {
      timeoutMs: 10_000,
      what: `the redis container on port ${this.port} to answer PING`,
    });
  }
}

async function startContainer(hostPort: number): Promise<StartedTestContainer> {
  // Loaded lazily: testcontainers takes most of a second to load, wasted when no runtime exists.
  const { GenericContainer, Wait } = await import('testcontainers');
  // Containers are not in the exit-hook registry: removing them is asynchronous, and
  // testcontainers' own reaper (Ryuk) removes them when this process dies.
  return new GenericContainer(REDIS_IMAGE)
    .withExposedPorts({ container: 6379, host: hostPort })
    .withCommand(['redis-server', '--save', '', '--appendonly', 'no'])
    .withWaitStrategy(Wait.forLogMessage(/Ready to accept connections/))
    .start();
}

const RUNTIME_VERDICT_KEY = Symbol.for('token-broker.test.containerRuntimeAvailable');
let runtimeProbe: Promise<boolean> | undefined;

/**
 * Whether a container runtime answers. Cached on the host process, so the second of a worker's
 * test files pays nothing; without a runtime, testcontainers fails in well under a second, and
 * a runtime that hangs is given {@link RUNTIME_PROBE_TIMEOUT_MS}.
 */
async function containerRuntimeAvailable(): Promise<boolean> {
  const host = hostProcess() as NodeJS.Process & { [RUNTIME_VERDICT_KEY]?: boolean };
  const cached = host[RUNTIME_VERDICT_KEY];
  if (cached !== undefined) return cached;
  runtimeProbe ??= (async () => {
    let timer: NodeJS.Timeout | undefined;
    try {
      const { getContainerRuntimeClient } = await import('testcontainers');
      await Promise.race([
        getContainerRuntimeClient(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error('container runtime probe timed out')),
            RUNTIME_PROBE_TIMEOUT_MS,
          );
        }),
      ]);
      return true;
    } catch {
      return false;
    } finally {
      clearTimeout(timer);
    }
  })();
  const verdict = await runtimeProbe;
  host[RUNTIME_VERDICT_KEY] = verdict;
  return verdict;
}

function notControllable(action: string): Error {
  return new Error(
    `cannot ${action}() the Redis given by REDIS_URL: it is not started by the tests. ` +
      'Unset REDIS_URL, use startRedis({ forceLocal: true }), or skip this test when ' +
      '`canControl` is false',
  );
}

/** What a standalone Redis and a pair behind one endpoint share: the broker sees one URL. */
abstract class OneEndpoint implements RedisTopology {
  readonly kind = 'standalone';
  readonly nodes: readonly string[];
  private readonly clients: Redis[] = [];

  protected constructor(
    readonly url: string,
    host: string,
    port: number,
  ) {
    this.nodes = [`${host}:${port}`];
  }

  env(): Record<string, string> {
    return { REDIS_MODE: 'standalone', REDIS_URL: this.url };
  }

  settings(): TopologySettings {
    return { mode: 'standalone', url: this.url };
  }

  client(): Redis {
    return track(this.clients, new Redis(this.url, { maxRetriesPerRequest: 1 }));
  }

  abstract flush(): Promise<void>;

  async stop(): Promise<void> {
    for (const c of this.clients.splice(0)) c.disconnect();
    await this.stopServers();
  }

  protected abstract stopServers(): Promise<void>;
}

/** A {@link TestRedis} as a {@link RedisTopology}: one endpoint, the broker's default mode. */
export class StandaloneRedis extends OneEndpoint {
  constructor(readonly redis: TestRedis) {
    super(redis.url, redis.host, redis.port);
  }

  async flush(): Promise<void> {
    await this.redis.flush();
  }

  protected async stopServers(): Promise<void> {
    await this.redis.stop();
  }
}

/**
 * A standalone endpoint with two Redis nodes behind it, like ElastiCache's primary endpoint:
 * the endpoint is a TCP forwarder ({@link FaultProxy}) that clients reach at {@link url}, and
 * the other node replicates the master so that {@link FixedEndpointPair.demote} can swap them.
 */
export class FixedEndpointPair extends OneEndpoint {
  private masterIndex: 0 | 1 = 0;
  /** Whether {@link FixedEndpointPair.detachReplica} cut the replica off. */
  private detached = false;

  private constructor(
    /** Node A (the first master) and node B. */
    readonly servers: readonly [RedisNode, RedisNode],
    /** The endpoint; exposed for faults beyond a failover (`cut()`, `blackhole()`). */
    readonly proxy: FaultProxy,
  ) {
    super(proxy.url('redis'), proxy.host, proxy.port);
  }

  /** Starts node A (master), node B (its replica) and the endpoint, pointing at A. */
  static async start(): Promise<FixedEndpointPair> {
    const nodes: RedisNode[] = [];
    try {
      nodes.push(await RedisNode.start([], { name: 'redis-server:pair-a' }));
      const replicaOfA = ['--replicaof', HOST, String(nodes[0].port)];
      nodes.push(await RedisNode.start(replicaOfA, { name: 'redis-server:pair-b' }));
      await waitForReplicaLink(nodes[1].address);
      const proxy = await FaultProxy.start({ target: { host: HOST, port: nodes[0].port } });
      return new FixedEndpointPair([nodes[0], nodes[1]], proxy);
    } catch (err) {
      await Promise.all(nodes.map((n) => n.stop()));
      throw err;
    }
  }

  /** `host:port` of the node that is master now (the endpoint's target). */
  get master(): string {
    return this.servers[this.masterIndex].address;
  }

  /**
   * Fails over the way a managed primary endpoint does: the replica becomes master (after
   * catching up, via Redis's coordinated `FAILOVER`), the old master becomes its replica, and
   * the endpoint sends *new* connections to the new master. Open connections stay with the old
   * master, which now answers every write with `READONLY`: a client must notice that itself.
   *
   * After {@link FixedEndpointPair.detachReplica}, the replica is promoted as it is, without
   * catching up: whatever the master took since is lost, like a failover to a lagging replica.
   */
  async demote(): Promise<Switch> {
    const old = this.servers[this.masterIndex];
    const next = this.servers[this.masterIndex === 0 ? 1 : 0];
    if (this.detached) {
      // The replica is a master already; the old master now copies its (older) data set.
      await adminCommand(old.address, 'REPLICAOF', HOST, next.port);
      this.detached = false;
    } else {
      // FAILOVER refuses a target the master does not list as online yet (a replica's link is
      // up a moment before the master finishes the sync on its side).
      await waitFor(
        async () => (await info(old.address, 'replication')).slave0?.includes('state=online'),
        { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 20, what: `${next.address} to be online` },
      );
      await adminCommand(old.address, 'FAILOVER', 'TO', HOST, next.port, 'TIMEOUT', 5000);
    }
    await waitFor(
      async () => {
        const oldInfo = await info(old.address, 'replication');
        return (
          oldInfo.role === 'slave' &&
          oldInfo.master_failover_state === 'no-failover' &&
          (await acceptsWrites(next.address))
        );
      },
      { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 50, what: `${next.address} to take over` },
    );
    this.proxy.retarget({ host: HOST, port: next.port });
    this.masterIndex = this.masterIndex === 0 ? 1 : 0;
    // Ready for the next demote(): the new replica must be in sync to be promoted in turn.
    await waitForReplicaLink(old.address);
    return { from: old.address, to: next.address };
  }

  async flush(): Promise<void> {
    await adminCommand(this.master, 'FLUSHALL');
  }

  protected async stopServers(): Promise<void> {
    await this.proxy.close();
    await Promise.all(this.servers.map((n) => n.stop()));
  }

  /**
   * Stops the replica from replicating, keeping the data it has (`REPLICAOF NO ONE` on it;
   * clients never reach it while the endpoint points at the master). Every write from now on
   * is missing from it, so the next {@link FixedEndpointPair.demote} loses them: the lock, a
   * token or an idempotency record written in between.
   */
  async detachReplica(): Promise<void> {
    const replica = this.servers[this.masterIndex === 0 ? 1 : 0];
    await adminCommand(replica.address, 'REPLICAOF', 'NO', 'ONE');
    this.detached = true;
  }
}

/** Starts a standalone pair behind a fixed endpoint. */
export function startFixedEndpointPair(): Promise<FixedEndpointPair> {
  return FixedEndpointPair.start();
}
