import { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { Redis } from 'ioredis';
import type { StartedTestContainer } from 'testcontainers';
import { hostProcess, ManagedProcess, minimalEnv, REDIS_PRIORITY } from './managed-process';
import { freePort } from './ports';
import { waitFor } from './wait';

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
  /** Stops Redis gracefully; a no-op for an external Redis, which is not ours to stop. */
  stop(): Promise<void>;
  /**
   * Starts Redis again on the same port with no data (killing it first if it still runs), and
   * resolves once it answers PING: clients configured with {@link TestRedis.url} reconnect.
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
const READY_TIMEOUT_MS = 10_000;
/** How long a container runtime may take to answer before we decide there is none. */
const RUNTIME_PROBE_TIMEOUT_MS = 3_000;
const STOP_GRACE_MS = 5_000;

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
  return ProcessRedis.start();
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
    await flushAll(this.url);
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
  readonly host = '127.0.0.1';
  readonly url: string;

  private constructor(
    readonly port: number,
    private proc: ManagedProcess,
  ) {
    this.url = `redis://${this.host}:${port}`;
  }

  static async start(): Promise<ProcessRedis> {
    // Another process can take the free port between freePort() and redis-server binding it;
    // a fresh port is the cure, so retry a few times on that one error.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      try {
        return new ProcessRedis(port, await spawnRedisServer(port));
      } catch (err) {
        if (!(err instanceof PortInUseError) || attempt >= 3) throw err;
      }
    }
  }

  async flush(): Promise<void> {
    await flushAll(this.url);
  }

  async kill(): Promise<void> {
    await this.proc.kill('SIGKILL');
  }

  async stop(): Promise<void> {
    await this.proc.stop(STOP_GRACE_MS);
  }

  async restart(): Promise<void> {
    await this.proc.kill('SIGKILL');
    // Same port, so clients that hold the URL reconnect. Redis binds with SO_REUSEADDR, so the
    // killed instance's TIME_WAIT sockets do not block it.
    this.proc = await spawnRedisServer(this.port);
  }

  isRunning(): boolean {
    return this.proc.isRunning();
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

  static async start(port?: number): Promise<ContainerRedis> {
    const hostPort = port ?? (await freePort());
    const container = await startContainer(hostPort);
    const redis = new ContainerRedis(container, container.getHost(), hostPort);
    await waitForPing(redis.host, hostPort, `the redis container on port ${hostPort}`);
    return redis;
  }

  async flush(): Promise<void> {
    await flushAll(this.url);
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
    await this.container.stop({ timeout: STOP_GRACE_MS });
  }

  async restart(): Promise<void> {
    await this.kill();
    // A new container rather than `docker restart`: it starts empty, like the process variant,
    // and the fixed host binding gives it the same port.
    this.container = await startContainer(this.port);
    this.running = true;
    await waitForPing(this.host, this.port, `the restarted redis container on port ${this.port}`);
  }

  isRunning(): boolean {
    return this.running;
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

class PortInUseError extends Error {}

async function spawnRedisServer(port: number): Promise<ManagedProcess> {
  const proc = ManagedProcess.start({
    name: `redis-server:${port}`,
    command: 'redis-server',
    args: [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      // No RDB and no AOF: nothing survives a restart, and nothing is written to disk.
      '--save',
      '',
      '--appendonly',
      'no',
      '--protected-mode',
      'no',
    ],
    env: minimalEnv(),
    priority: REDIS_PRIORITY,
    // Redis resolves relative files against its working directory; keep any stray file out of
    // the repository.
    cwd: tmpdir(),
  });
  const exitedEarly = new AbortController();
  void proc.exited.then(() => exitedEarly.abort(new Error('exited')));
  try {
    await waitForPing('127.0.0.1', port, `redis-server on port ${port}`, exitedEarly.signal);
    return proc;
  } catch (err) {
    await proc.kill('SIGKILL');
    const logs = proc.tail();
    if (/address already in use/i.test(logs)) {
      throw new PortInUseError(`port ${port} is taken:\n${logs}`);
    }
    if (proc.exitStatus?.error && 'code' in proc.exitStatus.error) {
      if (proc.exitStatus.error.code === 'ENOENT') {
        throw new Error(
          'redis-server is not on PATH: install it (apt-get install redis-server), set REDIS_URL ' +
            'to a disposable Redis, or provide a container runtime for testcontainers',
          { cause: proc.exitStatus.error },
        );
      }
    }
    const reason = exitedEarly.signal.aborted ? proc.describeExit() : errorMessage(err);
    throw new Error(`redis-server on port ${port} did not start: ${reason}\n${logs}`, {
      cause: err,
    });
  }
}

async function waitForPing(
  host: string,
  port: number,
  what: string,
  signal?: AbortSignal,
): Promise<void> {
  await waitFor(() => ping(host, port), {
    timeoutMs: READY_TIMEOUT_MS,
    intervalMs: 10,
    what: `${what} to answer PING`,
    signal,
  });
}

/**
 * One PING over a raw socket. Cheaper than an ioredis client per poll, and it has no reconnect
 * logic that could outlive the probe. Only `+PONG` counts: a Redis that is still loading
 * answers `-LOADING`.
 */
export async function ping(host: string, port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const socket = new Socket();
    let reply = '';
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1000, () => done(false));
    socket.once('error', () => done(false));
    socket.once('close', () => done(false));
    socket.on('data', (chunk: Buffer) => {
      reply += chunk.toString('latin1');
      if (reply.includes('\r\n')) done(reply.startsWith('+PONG'));
    });
    socket.connect(port, host, () => socket.write('*1\r\n$4\r\nPING\r\n'));
  });
}

async function flushAll(url: string): Promise<void> {
  // A short-lived client with no retries: flushing a dead server should fail now, not hang.
  const client = new Redis(url, {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 2000,
    commandTimeout: 5000,
  });
  client.on('error', () => {
    // Reported through the rejected command below; without a listener ioredis logs it.
  });
  try {
    await client.connect();
    await client.flushall();
  } finally {
    client.disconnect();
  }
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

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
