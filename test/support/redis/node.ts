import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { type Cluster, Redis } from 'ioredis';
import { ManagedProcess, minimalEnv, REDIS_PRIORITY } from '../managed-process';
import { freePort } from '../ports';
import { waitFor } from '../wait';

const run = promisify(execFile);

export const HOST = '127.0.0.1';
const READY_TIMEOUT_MS = 15_000;
/**
 * Deadline for a topology to form, and for a failover to complete. Usually seconds; generous
 * because a sentinel whose timer is starved for over 2 s (a busy machine) enters TILT mode and
 * does nothing for 30 s, which stretched a crash's settling past a minute in CI.
 */
export const SETTLE_TIMEOUT_MS = 120_000;

/** Options for {@link RedisNode.start}. */
export interface RedisNodeOptions {
  /** Label in logs and errors. @default the command */
  name?: string;
  /** Run `redis-sentinel`; the arguments are then lines of its configuration file. */
  sentinel?: boolean;
  /** Listen on this port (no retry on another one when it is taken). */
  port?: number;
  /** Listen with TLS only (`--port 0 --tls-port <port>`). */
  tlsOnly?: boolean;
}

/**
 * One `redis-server` or `redis-sentinel` process on a loopback port, in a directory of its own
 * (a replica stores each full sync as an RDB file even without persistence, cluster nodes write
 * `nodes.conf`, sentinels rewrite their configuration): every Redis the tests start is one of
 * these. Stop it in `afterAll`; if the test runner dies first, the exit hook of
 * `managed-process` kills it and removes its directory.
 */
export class RedisNode {
  private constructor(
    readonly port: number,
    readonly dir: string,
    private readonly proc: ManagedProcess,
  ) {}

  /** `127.0.0.1:<port>`. */
  get address(): string {
    return `${HOST}:${this.port}`;
  }

  /**
   * Starts a node on a free loopback port, without persistence, and resolves once its log says
   * it accepts connections (PING is no probe for a server that wants a password or TLS).
   * Retries on another port when the one chosen was taken before the server bound it.
   * @param args extra `redis-server` arguments (`['--requirepass', 'pw']`), or a sentinel's
   *   configuration lines; a function gets the port and a second free one (a cluster bus).
   */
  static async start(
    args: readonly string[] | ((port: number, sparePort: number) => string[]) = [],
    opts: RedisNodeOptions = {},
  ): Promise<RedisNode> {
    const command = opts.sentinel ? 'redis-sentinel' : 'redis-server';
    for (let attempt = 1; ; attempt++) {
      const [port, spare] = await Promise.all([opts.port ?? freePort(), freePort()]);
      if (port === spare) continue;
      const extra = typeof args === 'function' ? args(port, spare) : args;
      const dir = mkdtempSync(join(tmpdir(), 'tb-redis-'));
      const name = `${opts.name ?? command}:${port}`;
      const proc = ManagedProcess.start({
        name,
        command,
        args: opts.sentinel
          ? [sentinelConfig(dir, port, extra)]
          : serverArgs(dir, port, opts, extra),
        env: minimalEnv(),
        cwd: dir,
        // Removed when it exits, also by the exit hook that kills an orphaned node.
        dir,
        priority: REDIS_PRIORITY,
        realtime: opts.sentinel,
      });
      const node = new RedisNode(port, dir, proc);
      try {
        await waitFor(
          () => {
            if (!proc.isRunning()) throw new Error(proc.describeExit());
            return /Ready to accept connections|Sentinel ID is/.test(proc.tail(200));
          },
          { timeoutMs: READY_TIMEOUT_MS, intervalMs: 10, what: `${name} to start` },
        );
        return node;
      } catch (err) {
        await node.stop();
        const logs = proc.tail();
        if (/address already in use/i.test(logs) && attempt < 3 && !opts.port) continue;
        const error = proc.exitStatus?.error;
        if (error && 'code' in error && error.code === 'ENOENT') {
          throw new Error(
            `${command} is not on PATH: install it (apt-get install ${command}; .ci/run does); ` +
              'for a standalone Redis, REDIS_URL or a container runtime for testcontainers will do',
            { cause: error },
          );
        }
        throw new Error(`${name} did not start: ${errorMessage(err)}\n${logs}`, { cause: err });
      }
    }
  }

  /** Runs `redis-cli -p <port> <args>` and returns its stdout, trimmed. */
  async cli(...args: string[]): Promise<string> {
    const argv = ['-h', HOST, '-p', String(this.port), ...args];
    const { stdout } = await run('redis-cli', argv, { env: minimalEnv(), timeout: 10_000 });
    return stdout.trim();
  }

  isRunning(): boolean {
    return this.proc.isRunning();
  }

  /** The last lines of its log, for failure messages. */
  tail(n = 40): string {
    return this.proc.tail(n);
  }

  /** Kills it (SIGKILL: a crashed node, and nothing to save); its directory goes with it. */
  async stop(): Promise<void> {
    await this.proc.kill('SIGKILL');
  }
}

function serverArgs(
  dir: string,
  port: number,
  opts: RedisNodeOptions,
  extra: readonly string[],
): string[] {
  return [
    ...(opts.tlsOnly ? ['--port', '0', '--tls-port', String(port)] : ['--port', String(port)]),
    '--bind',
    HOST,
    // No RDB and no AOF: nothing survives a restart, and nothing is written to disk.
    '--save',
    '',
    '--appendonly',
    'no',
    // A master waits 5 s by default for more replicas to share a full sync with: every
    // replica attach (start, failover) would take that long.
    '--repl-diskless-sync-delay',
    '0',
    '--protected-mode',
    'no',
    '--dir',
    dir,
    ...extra,
  ];
}

/** Writes a sentinel's configuration file: Sentinel rewrites it as it learns the topology. */
function sentinelConfig(dir: string, port: number, lines: readonly string[]): string {
  const file = join(dir, 'sentinel.conf');
  const head = [`port ${port}`, `bind ${HOST}`, 'protected-mode no', `dir ${dir}`];
  writeFileSync(file, [...head, ...lines, ''].join('\n'));
  return file;
}

/**
 * One command over a short-lived connection without retries, to `host:port` or a `redis://`
 * URL: the helpers poll nodes that may be down, and must neither hang nor leave a reconnecting
 * client behind.
 */
export async function adminCommand(
  target: string,
  ...args: Array<string | number>
): Promise<unknown> {
  const options = {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 2000,
    commandTimeout: 5000,
  };
  const client = target.includes('://')
    ? new Redis(target, options)
    : new Redis({ ...hostPort(target), ...options });
  // Reported through the rejected command; without a listener ioredis logs it.
  client.on('error', () => undefined);
  try {
    await client.connect();
    const [command, ...rest] = args;
    return await client.call(String(command), ...rest.map(String));
  } finally {
    client.disconnect();
  }
}

/** `INFO <section>` (or `CLUSTER INFO` for `cluster`) as a record of its `field:value` lines. */
export async function info(address: string, section: string): Promise<Record<string, string>> {
  const args = section === 'cluster' ? ['CLUSTER', 'INFO'] : ['INFO', section];
  const out: Record<string, string> = {};
  for (const line of String(await adminCommand(address, ...args)).split(/\r?\n/)) {
    const at = line.indexOf(':');
    if (at > 0 && !line.startsWith('#')) out[line.slice(0, at)] = line.slice(at + 1);
  }
  return out;
}

/** Whether `address` takes a write now (a DEL of a key that never exists: no data changes). */
export async function acceptsWrites(address: string): Promise<boolean> {
  return adminCommand(address, 'DEL', 'redis-topology:probe').then(
    () => true,
    () => false,
  );
}

export async function waitForReplicaLink(address: string): Promise<void> {
  await waitFor(async () => (await info(address, 'replication')).master_link_status === 'up', {
    timeoutMs: SETTLE_TIMEOUT_MS,
    intervalMs: 50,
    what: `${address} to sync with its master`,
  });
}

export function hostPort(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(':');
  return { host: address.slice(0, at), port: Number(address.slice(at + 1)) };
}

/** Keeps `client` in `list` (to disconnect it at stop) with its errors silenced. */
export function track<T extends Redis | Cluster>(list: T[], client: T): T {
  // Failovers make clients see errors; the assertions look at command results, not events.
  client.on('error', () => undefined);
  list.push(client);
  return client;
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
