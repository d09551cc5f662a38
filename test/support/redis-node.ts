import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ManagedProcess, minimalEnv, REDIS_PRIORITY } from './managed-process';
import { freePort } from './ports';
import { waitFor } from './wait';

const run = promisify(execFile);
const READY_TIMEOUT_MS = 15_000;

/**
 * One `redis-server` (or `redis-sentinel`) process with arbitrary extra arguments, in its own
 * temporary directory (cluster nodes write `nodes.conf`, sentinels rewrite their config file).
 * For tests that need what {@link startRedis} does not offer: passwords, ACL users, TLS,
 * replication, Sentinel and Cluster. Stop it in `afterAll`.
 */
export class RedisNode {
  private constructor(
    readonly port: number,
    readonly dir: string,
    private readonly proc: ManagedProcess,
  ) {}

  /** `127.0.0.1:<port>`. */
  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /**
   * Starts a node on a free loopback port and resolves once its log says it accepts
   * connections (PING is no probe for a server that requires a password).
   * @param args extra `redis-server` arguments, e.g. `['--requirepass', 'pw']`
   * @param opts.port listen on this port (`--port`); `opts.portArg: '--tls-port'` for TLS only
   */
  static async start(
    args: readonly string[] = [],
    opts: { sentinel?: boolean; port?: number; tlsOnly?: boolean } = {},
  ): Promise<RedisNode> {
    const port = opts.port ?? (await freePort());
    const dir = mkdtempSync(join(tmpdir(), 'tb-redis-node-'));
    let command = 'redis-server';
    let fullArgs: string[];
    const portArgs = opts.tlsOnly
      ? ['--port', '0', '--tls-port', String(port)]
      : ['--port', String(port)];
    if (opts.sentinel) {
      // A sentinel needs a writable config file of its own; `args` are its config lines.
      const conf = join(dir, 'sentinel.conf');
      writeFileSync(
        conf,
        [`port ${port}`, 'bind 127.0.0.1', `dir ${dir}`, ...args].join('\n') + '\n',
      );
      command = 'redis-sentinel';
      fullArgs = [conf];
    } else {
      fullArgs = [
        ...portArgs,
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--protected-mode',
        'no',
        '--dir',
        dir,
        ...args,
      ];
    }
    const proc = ManagedProcess.start({
      name: `${command}:${port}`,
      command,
      args: fullArgs,
      env: minimalEnv(),
      cwd: dir,
      priority: REDIS_PRIORITY,
    });
    const node = new RedisNode(port, dir, proc);
    try {
      await waitFor(
        () => {
          if (!proc.isRunning()) throw new Error(`${proc.describeExit()}\n${proc.tail()}`);
          return /Ready to accept connections|Sentinel ID is/.test(proc.tail(200));
        },
        {
          timeoutMs: READY_TIMEOUT_MS,
          intervalMs: 20,
          what: `${command} on port ${port} to start`,
        },
      );
    } catch (err) {
      await node.stop();
      throw err;
    }
    return node;
  }

  /** Runs `redis-cli -p <port> <args>` and returns its stdout, trimmed. */
  async cli(...args: string[]): Promise<string> {
    const { stdout } = await run(
      'redis-cli',
      ['-h', '127.0.0.1', '-p', String(this.port), ...args],
      {
        env: minimalEnv(),
        timeout: 10_000,
      },
    );
    return stdout.trim();
  }

  /** The last lines of its log, for failure messages. */
  tail(n = 40): string {
    return this.proc.tail(n);
  }

  async stop(): Promise<void> {
    await this.proc.kill('SIGKILL');
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A Sentinel group: one master, one replica, one sentinel watching `mymaster`. */
export interface SentinelGroup {
  readonly masterName: string;
  readonly master: RedisNode;
  readonly replica: RedisNode;
  readonly sentinel: RedisNode;
  stop(): Promise<void>;
}

export async function startSentinelGroup(masterName = 'mymaster'): Promise<SentinelGroup> {
  const master = await RedisNode.start();
  const replica = await RedisNode.start(['--replicaof', '127.0.0.1', String(master.port)]);
  const sentinel = await RedisNode.start(
    [
      `sentinel monitor ${masterName} 127.0.0.1 ${master.port} 1`,
      `sentinel down-after-milliseconds ${masterName} 1000`,
      `sentinel failover-timeout ${masterName} 5000`,
    ],
    { sentinel: true },
  );
  await waitFor(
    async () =>
      (await sentinel.cli('SENTINEL', 'get-master-addr-by-name', masterName)).includes(
        String(master.port),
      ),
    { timeoutMs: READY_TIMEOUT_MS, what: 'the sentinel to know the master' },
  );
  return {
    masterName,
    master,
    replica,
    sentinel,
    stop: async () => {
      await Promise.all([sentinel.stop(), replica.stop(), master.stop()]);
    },
  };
}

/** A Redis Cluster of `masters` masters (and `replicasPerMaster` replicas each), all slots assigned. */
export interface RedisClusterNodes {
  readonly nodes: readonly RedisNode[];
  stop(): Promise<void>;
}

export async function startCluster(masters = 3, replicasPerMaster = 0): Promise<RedisClusterNodes> {
  const nodes = await Promise.all(
    Array.from({ length: masters * (1 + replicasPerMaster) }, () =>
      RedisNode.start([
        '--cluster-enabled',
        'yes',
        '--cluster-node-timeout',
        '2000',
        // A replica may take over however long ago it last synced: the test's data is tiny and
        // a freshly created replica may not have finished its first sync when its master dies.
        '--cluster-replica-validity-factor',
        '0',
      ]),
    ),
  );
  const stop = async () => {
    await Promise.all(nodes.map((n) => n.stop()));
  };
  try {
    await run(
      'redis-cli',
      [
        '--cluster',
        'create',
        ...nodes.map((n) => n.address),
        '--cluster-replicas',
        String(replicasPerMaster),
        '--cluster-yes',
      ],
      { env: minimalEnv(), timeout: 30_000 },
    );
    for (const node of nodes) {
      await waitFor(async () => (await node.cli('CLUSTER', 'INFO')).includes('cluster_state:ok'), {
        timeoutMs: READY_TIMEOUT_MS,
        what: `cluster node ${node.address} to report cluster_state:ok`,
      });
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return { nodes, stop };
}
