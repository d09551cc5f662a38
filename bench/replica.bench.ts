import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { get } from 'node:http';
import { resolve } from 'node:path';
import {
  SecretsManagerEmulator,
  secretsManagerClientEnv,
} from '../emulator/secrets-manager-emulator';
import { ManagedProcess, minimalEnv } from '../test/support/managed-process';
import { freePort } from '../test/support/ports';
import { repoRoot } from '../test/support/repo-root';
import { startRedis } from '../test/support/redis/standalone';
import { imageNode, imageRuntime } from './paths';
import { startBenchSetup } from './setup';

/** The targets for one replica: ready within a second, idle RSS at most 100 MB once settled. */
export const REPLICA_TARGETS = { readyMs: 1000, idleRssMb: 100 } as const;

/** One configuration on one Node binary: medians over the starts. */
export interface ReplicaRow {
  name: string;
  node: string;
  starts: number;
  /** Spawn to the first `GET /health/ready` 200, median. */
  readyMs: number;
  /**
   * CPU time (user + system) the broker spent until ready, median: what start-to-ready is on
   * an idle machine with a core to spare, and unlike wall time not inflated when other
   * processes compete for the CPU. 10 ms resolution (clock ticks).
   */
  readyCpuMs: number;
  /** VmRSS after `idleMs` of idling once ready, median. */
  idleRssMb: number;
  /**
   * VmRSS once idle memory has settled (one start per row, all rows at once): V8 keeps the
   * young generation it grew during start-up until its memory reducer runs at idle, which
   * takes from a few seconds up to its ~100 s watchdog. Absent when `settleMs` is 0.
   */
  settledRssMb?: number;
  /** Seconds after ready at which the settled figure was reached (or `settleMs` ran out). */
  settledAfterS?: number;
}

const CLIENT_ID = 'replica-bench';
const CREDENTIALS = { client_id: 'replica-merchant', client_secret: 'replica-bench-secret' };
/** Readiness is polled this often: the start-to-ready figure is exact to about this much. */
const POLL_MS = 5;

/**
 * Start-to-ready and idle RSS of `node dist/main.js` (the production build), the way a
 * Kubernetes rollout meets them: a fresh process per start, Redis standalone on a
 * `redis-server` this bench starts, the provider emulator granting the first token (readiness
 * waits for it). Two configurations:
 * - `file + api-key`: credentials and API keys from files, the usual small deployment;
 * - `Secrets Manager + kubernetes`: credentials from the Secrets Manager emulator through the
 *   real AWS SDK, callers as service accounts (the JWT stack, a JWKS fetched at start).
 *
 * Starts are sequential (a replica starting next to another measures the other), and each
 * figure is the median of `starts`.
 */
export async function benchReplica(opts: {
  starts: number;
  idleMs: number;
  /** How long to wait at most for idle memory to settle; 0 skips that measurement. */
  settleMs: number;
  /** Node binaries to run the broker on, with a label each. */
  nodes: Array<{ label: string; path: string }>;
}): Promise<ReplicaRow[]> {
  // BENCH_REPLICA_MAIN compares another build (e.g. one of an earlier commit, in .tmp/).
  const main = resolve(repoRoot(), process.env.BENCH_REPLICA_MAIN ?? 'dist/main.js');
  if (!existsSync(main)) throw new Error(`${main} does not exist: run \`npm run build\` first`);
  const redis = await startRedis({ forceLocal: true });
  const setup = await startBenchSetup({
    name: 'replica',
    clientId: CLIENT_ID,
    credentials: CREDENTIALS,
  });
  const cacheKey = randomBytes(32).toString('base64');
  const secrets = await SecretsManagerEmulator.start({
    secrets: { 'replica/credentials': JSON.stringify(CREDENTIALS), 'replica/cache-key': cacheKey },
  });
  // NODE_ENV=production as in the image (it also makes the cache key mandatory with Redis).
  const common = {
    ...setup.env,
    REDIS_URL: redis.url,
    LOG_LEVEL: 'info',
    NODE_ENV: 'production',
  };
  const configs: Array<{ name: string; env: Record<string, string> }> = [
    {
      name: 'file + api-key',
      env: {
        ...common,
        CREDENTIALS_FILE: setup.credentialsFile,
        CACHE_KEY_FILE: setup.file('cache-key', cacheKey),
        ...setup.apiKeyAuth,
      },
    },
    {
      name: 'Secrets Manager + kubernetes',
      env: {
        ...common,
        ...secretsManagerClientEnv(secrets.url),
        CREDENTIALS_SECRET_ID: 'replica/credentials',
        CACHE_KEY_SECRET_ID: 'replica/cache-key',
        ...setup.kubernetesAuth,
      },
    },
  ];
  try {
    const rows: ReplicaRow[] = [];
    for (const node of opts.nodes) {
      for (const config of configs) {
        const ready: number[] = [];
        const cpu: number[] = [];
        const rss: number[] = [];
        for (let i = 0; i < opts.starts; i++) {
          const run = await startOnce(node.path, main, config.env, { idleMs: opts.idleMs });
          ready.push(run.readyMs);
          cpu.push(run.readyCpuMs);
          rss.push(run.idleRssMb);
        }
        rows.push({
          name: config.name,
          node: node.label,
          starts: opts.starts,
          readyMs: median(ready),
          readyCpuMs: median(cpu),
          idleRssMb: median(rss),
        });
      }
    }
    if (opts.settleMs > 0) {
      // Concurrently: RSS does not depend on the CPU left over, and waiting up to ~100 s per
      // row one after the other would make the section far too long.
      const pairs = opts.nodes.flatMap((node) => configs.map((config) => ({ node, config })));
      const settled = await Promise.all(
        pairs.map(({ node, config }) =>
          startOnce(node.path, main, config.env, { idleMs: opts.idleMs, settleMs: opts.settleMs }),
        ),
      );
      settled.forEach((run, i) => {
        rows[i].settledRssMb = run.settledRssMb;
        rows[i].settledAfterS = run.settledAfterS;
      });
    }
    return rows;
  } finally {
    await Promise.all([setup.close(), secrets.close(), redis.stop()]);
  }
}

/**
 * This Node and the image's (or `BENCH_REPLICA_NODE`), once each: the image's is what replicas
 * run, this one what the tests and the sandbox may run.
 */
export function replicaNodes(): Array<{ label: string; path: string }> {
  const image = imageNode();
  const other = process.env.BENCH_REPLICA_NODE ?? image?.path;
  const paths = [...new Set([process.execPath, ...(other === undefined ? [] : [other])])];
  return paths.map((path) => {
    const version =
      path === process.execPath
        ? process.versions.node
        : execFileSync(path, ['-p', 'process.versions.node'], { encoding: 'utf8' }).trim();
    const isImage = version.split('.')[0] === image?.major;
    return { label: `Node ${version}${isImage ? ' (image)' : ''}`, path };
  });
}

/** RSS that fell by this share from its early idle value counts as the memory reducer's work. */
const SETTLED_DROP = 0.1;

/**
 * One start: spawn, poll readiness, idle `idleMs`, read VmRSS; with `settleMs`, keep idling
 * until RSS has dropped by {@link SETTLED_DROP} and held for 3 s, or `settleMs` ran out. Stop.
 */
async function startOnce(
  node: string,
  main: string,
  env: Record<string, string>,
  opts: { idleMs: number; settleMs?: number },
): Promise<{
  readyMs: number;
  readyCpuMs: number;
  idleRssMb: number;
  settledRssMb?: number;
  settledAfterS?: number;
}> {
  const port = await freePort();
  const started = performance.now();
  const proc = ManagedProcess.start({
    name: 'replica',
    command: node,
    // The image's Node flags, or BENCH_REPLICA_NODE_ARGS to try others (e.g. `--optimize-for-size`).
    args: [
      ...(process.env.BENCH_REPLICA_NODE_ARGS?.split(' ').filter(Boolean) ??
        imageRuntime().nodeArgs),
      main,
    ],
    env: { ...minimalEnv(), ...imageRuntime().env, ...env, PORT: String(port) },
    cwd: repoRoot(),
  });
  try {
    const deadline = started + 15_000;
    for (;;) {
      if (!proc.isRunning()) throw new Error(`${proc.describeExit()} at start:\n${proc.tail(30)}`);
      if ((await readyStatus(port)) === 200) break;
      if (performance.now() > deadline) {
        throw new Error(`not ready after 15 s:\n${proc.tail(30)}`);
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
    const readyMs = performance.now() - started;
    const readyCpuMs = cpuMs(proc.pid!);
    const readyAt = performance.now();
    // Idle, as a replica between rollouts and refreshes.
    await new Promise((r) => setTimeout(r, opts.idleMs));
    const idleRssMb = rssMb(proc.pid!);
    if (!opts.settleMs) return { readyMs, readyCpuMs, idleRssMb };
    let settledRssMb = idleRssMb;
    let held = 0;
    while (performance.now() - readyAt < opts.settleMs && held < 3) {
      await new Promise((r) => setTimeout(r, 1000));
      const now = rssMb(proc.pid!);
      held =
        now <= idleRssMb * (1 - SETTLED_DROP) && Math.abs(now - settledRssMb) < 1 ? held + 1 : 0;
      settledRssMb = now;
    }
    const settledAfterS = (performance.now() - readyAt) / 1000;
    return { readyMs, readyCpuMs, idleRssMb, settledRssMb, settledAfterS };
  } finally {
    await proc.stop(5000);
  }
}

function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1]) / 1024;
}

/** utime + stime of a process, from `/proc/<pid>/stat` (clock ticks of 10 ms on Linux). */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name, which is in parentheses and may hold spaces.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = Number(fields[11]) + Number(fields[12]);
  return ticks * 10;
}

function readyStatus(port: number): Promise<number> {
  return new Promise((done) => {
    const req = get(
      { host: '127.0.0.1', port, path: '/health/ready', agent: false, timeout: 1000 },
      (res) => {
        res.resume();
        res.once('end', () => done(res.statusCode ?? 0));
      },
    );
    req.once('timeout', () => req.destroy());
    req.once('error', () => done(0));
  });
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}
