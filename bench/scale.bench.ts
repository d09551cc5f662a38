import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { ProviderEmulator } from '../emulator/provider-emulator';
import type { BrokerProcess } from '../test/support/broker-process';
import { startRedis } from '../test/support/redis/standalone';
import { spawnImageBroker } from './paths';

/**
 * The scale rows of issue #36: N clients on one provider, two replicas sharing one
 * `redis-server`, file credentials, one API-key caller granted every client. Everything is read
 * from outside the broker (HTTP, `/proc/<pid>/*`, the emulator's log of token requests, Redis
 * `INFO commandstats`), so the rows mean the same whatever the broker's internals are.
 */

/** How to run {@link benchScale}. */
export interface ScaleOptions {
  /** Numbers of clients, one run each, in this order (the first is the baseline of the ratios). */
  clients: number[];
  /** Lifetime of the emulator's tokens, seconds. */
  lifetimeS: number;
  /** `TOKEN_REFRESH_AHEAD_SECONDS`: the refresh window. */
  aheadS: number;
  /** Seconds of `GET /token` load per replica and round. */
  durationSec: number;
  /** Rounds of that load, interleaved over the N. */
  rounds: number;
  connections: number;
}

/** What one N measured. */
export interface ScaleRun {
  n: number;
  /** The first replica (empty Redis): spawn to `/health/ready` 200, and its CPU time until then. */
  readyMs: number;
  readyCpuS: number;
  /** The second replica, joining while the first holds every token. */
  joinReadyMs: number;
  joinReadyCpuS: number;
  /**
   * VmRSS of the two replicas (mean), the lowest of the readings every second in the second
   * half of the idle lifetime, before any load, KiB.
   */
  rssKb: number;
  /**
   * The same, read every second for {@link QUIET_RSS_MS} once every client holds a token of the
   * provider's lifetime ({@link LOAD_LIFETIME_S}) and no refresh is due: an idle replica as in
   * production, where a thousand clients refresh about once every two seconds, not 25 times a
   * second as at the idle lifetime's short tokens.
   */
  quietRssKb: number;
  /** Most token requests the emulator received in one second: each client's first, and later ones. */
  busiestStartup: number;
  busiestRefresh: number;
  /**
   * Token requests per client per refresh cycle, from start to the end of the idle lifetime:
   * one client's requests closer than half the time between two refreshes are one cycle.
   */
  requestsPerCycle: number;
  /** Most requests of one client in one cycle (1: no duplicate). */
  maxPerCycle: number;
  /** Times a client went longer than a lifetime between two tokens (a lapse). */
  lapses: number;
  /** Redis commands per client per replica over the idle lifetime (scaled to exactly one). */
  redisPerClient: number;
  /**
   * `GET /token` with a random client per request, per CPU-second of the broker beyond its quiet
   * background (timers, health pings), with tokens of {@link LOAD_LIFETIME_S} so no refresh falls
   * in the load; the quiet CPU is read just before the rounds.
   */
  tokenPerCpuS: number;
  /** The same per CPU-second of the broker, the background included. */
  tokenPerCpuSRaw: number;
  /** Median over the rounds of {@link tokenPerCpuS} against the first N's in the same round. */
  tokenVsFirst: number;
  /** CPU the two replicas spent idle, CPU-seconds per second (both together). */
  idleCpuPerS: number;
  tokenRequests: number;
  tokenNon2xx: number;
  metricsBytes: number;
}

/** Token lifetime during the load rounds, seconds: the provider's (SPEC.md), no refresh falls in them. */
export const LOAD_LIFETIME_S = 1800;
/** How long the kept replicas' quiet CPU is read before the load rounds, ms. */
const QUIET_MS = 3000;
/**
 * How long the quiet replicas' RSS is read after that, ms: V8 shrinks an idle heap some 8 s after
 * its allocations stop (its memory reducer), and the floor comes after.
 */
export const QUIET_RSS_MS = 20_000;

/** Readiness is polled this often: the start-to-ready figure is exact to about this much. */
const POLL_MS = 5;

/** The figures of one N before the load rounds. */
type IdleFigures = Omit<
  ScaleRun,
  | 'tokenPerCpuS'
  | 'tokenPerCpuSRaw'
  | 'tokenVsFirst'
  | 'tokenRequests'
  | 'tokenNon2xx'
  | 'metricsBytes'
>;

/** The two replicas of one N, kept for the load rounds, and what stops all of that N's. */
interface Kept {
  procs: BrokerProcess[];
  /** Each one's CPU while quiet with {@link LOAD_LIFETIME_S} tokens, CPU-seconds per second. */
  quietCpuPerS: number[];
  ids: string[];
  apiKey: string;
  stop(): Promise<void>;
}

/**
 * One N after the other (start, idle lifetime, with nothing else started), keeping both replicas
 * of each; then `rounds` of `GET /token` load over the kept replicas, one after the other and
 * interleaved so drift on a shared machine hits every N alike, and `/metrics` of each. Two
 * processes per N, pooled: one process's throughput moves by some 10 % from another's of the same
 * build (its JIT and memory layout), which a ratio of single processes reads as a difference.
 */
export async function benchScale(opts: ScaleOptions): Promise<ScaleRun[]> {
  const idle: IdleFigures[] = [];
  const kept: Kept[] = [];
  try {
    for (const n of opts.clients) {
      const { run, kept: k } = await scaleRun(n, opts);
      idle.push(run);
      kept.push(k);
    }
    const rounds = kept.map(
      () => [] as Array<{ requests: number; non2xx: number; cpuS: number; netCpuS: number }>,
    );
    for (const k of kept)
      for (const p of k.procs) await loadRandomClient(k, p, opts.connections, 1);
    for (let round = 0; round < opts.rounds; round++) {
      for (const [i, k] of kept.entries()) {
        // The N's replicas one after the other, pooled into the round's figure.
        const sum = { requests: 0, non2xx: 0, cpuS: 0, netCpuS: 0 };
        for (const [j, p] of k.procs.entries()) {
          const cpuBefore = cpuSecondsOf(p.pid!);
          const from = performance.now();
          const r = await loadRandomClient(k, p, opts.connections, opts.durationSec);
          const cpuS = cpuSecondsOf(p.pid!) - cpuBefore;
          sum.requests += r.requests.total;
          sum.non2xx += r.non2xx + r.errors;
          sum.cpuS += cpuS;
          sum.netCpuS += cpuS - k.quietCpuPerS[j] * ((performance.now() - from) / 1000);
        }
        rounds[i].push(sum);
      }
    }
    const runs: ScaleRun[] = [];
    for (const [i, k] of kept.entries()) {
      // The admin listener, where the chart's Prometheus reads it.
      const metrics = await fetch(`${k.procs[0].adminUrl!}/metrics`);
      const metricsBytes = (await metrics.arrayBuffer()).byteLength;
      if (metrics.status !== 200) throw new Error(`GET /metrics answered ${metrics.status}`);
      const perCpu = rounds[i].map((r) => r.requests / Math.max(r.netCpuS, 0.01));
      runs.push({
        ...idle[i],
        tokenPerCpuS: median(perCpu),
        tokenPerCpuSRaw: median(rounds[i].map((r) => r.requests / Math.max(r.cpuS, 0.01))),
        // Per round against the first N's same round, then the median.
        tokenVsFirst: median(
          perCpu.map((v, j) => v / (rounds[0][j].requests / Math.max(rounds[0][j].netCpuS, 0.01))),
        ),
        tokenRequests: rounds[i].reduce((s, r) => s + r.requests, 0),
        tokenNon2xx: rounds[i].reduce((s, r) => s + r.non2xx, 0),
        metricsBytes,
      });
    }
    return runs;
  } finally {
    for (const k of kept) await k.stop();
  }
}

/** `GET /token` from `connections` autocannon connections, each request for a random client. */
function loadRandomClient(
  k: Kept,
  proc: BrokerProcess,
  connections: number,
  duration: number,
): Promise<autocannon.Result> {
  return autocannon({
    url: proc.url,
    connections,
    duration,
    headers: { authorization: `Bearer ${k.apiKey}` },
    requests: [
      {
        method: 'GET',
        setupRequest: (req) => ({
          ...req,
          path: `/token?client=${k.ids[Math.floor(Math.random() * k.ids.length)]}`,
        }),
      },
    ],
  });
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** N clients on one provider emulator and one `redis-server`, and the brokers' config. */
export interface ScaleSetup {
  /** Client ids, `merchant-0000` on. */
  ids: string[];
  /** Client id at the provider (`<id>-client`) to the broker's client id. */
  merchantOf: ReadonlyMap<string, string>;
  emulator: ProviderEmulator;
  redisUrl: string;
  /** The API key of the one caller, granted every client. */
  apiKey: string;
  /** Environment for every broker: config file, Redis, cache key, production mode. */
  env: Record<string, string>;
  close(): Promise<void>;
}

/**
 * Starts the provider emulator knowing `n` clients (tokens of `lifetimeS`), a `redis-server`,
 * and writes each client's credentials file, the cache key and a `BROKER_CONFIG_FILE` listing
 * every client with one API-key caller granted all of them (`clients: ["*"]`).
 */
export async function startScaleSetup(n: number, lifetimeS: number): Promise<ScaleSetup> {
  const ids = Array.from({ length: n }, (_, i) => `merchant-${String(i).padStart(4, '0')}`);
  const credentials = ids.map((id) => ({
    client_id: `${id}-client`,
    client_secret: randomBytes(16).toString('hex'),
  }));
  const merchantOf = new Map(credentials.map((c, i) => [c.client_id, ids[i]]));
  const redis = await startRedis({ forceLocal: true });
  const emulator = await ProviderEmulator.start({
    credentials: Object.fromEntries(credentials.map((c) => [c.client_id, c.client_secret])),
    knobs: { tokenLifetimeSeconds: lifetimeS },
  });
  const dir = mkdtempSync(join(tmpdir(), 'tb-bench-scale-'));
  const file = (name: string, content: string) => {
    const path = join(dir, name);
    writeFileSync(path, content, { mode: 0o600 });
    return path;
  };
  const apiKey = randomBytes(32).toString('base64url');
  const config = {
    clients: ids.map((id, i) => ({
      id,
      authUrl: emulator.url,
      baseUrl: emulator.url,
      credentials: { file: file(`${id}.json`, JSON.stringify(credentials[i])) },
    })),
    callerAuth: {
      apiKeys: [
        {
          name: 'bench',
          sha256: createHash('sha256').update(apiKey).digest('hex'),
          clients: ['*'],
        },
      ],
    },
  };
  const env = {
    BROKER_CONFIG_FILE: file('broker.json', JSON.stringify(config)),
    CALLER_AUTH_MODE: 'api-key',
    REDIS_URL: redis.url,
    CACHE_KEY_FILE: file('cache-key', randomBytes(32).toString('base64')),
    // As in the image (it also makes the cache key mandatory with Redis).
    NODE_ENV: 'production',
    HOST: '127.0.0.1',
    // The default level: the token audit trail (`token issued`, aggregated per caller, client and
    // token) is on, as in production; `warn` switched it off, and the hot path's per-client part
    // with it.
    LOG_LEVEL: 'info',
  };
  return {
    ids,
    merchantOf,
    emulator,
    redisUrl: redis.url,
    apiKey,
    env,
    async close() {
      await Promise.all([emulator.close(), redis.stop()]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function scaleRun(n: number, opts: ScaleOptions): Promise<{ run: IdleFigures; kept: Kept }> {
  const setup = await startScaleSetup(n, opts.lifetimeS);
  const { ids, merchantOf, emulator, apiKey } = setup;
  const env = {
    ...setup.env,
    TOKEN_REFRESH_AHEAD_SECONDS: String(opts.aheadS),
    // The lifetimes here are some forty times shorter than the provider's 30 minutes, so a
    // thousand clients need forty times the rate a production fleet would: the fleet-wide cap
    // would measure itself, not how the refreshes spread; so would its concurrency cap (8
    // requests in flight spread a thousand by the provider's latency alone).
    TOKEN_ENDPOINT_RATE_PER_SECOND: '0',
    TOKEN_ENDPOINT_MAX_CONCURRENCY: '0',
  };
  const brokers: BrokerProcess[] = [];
  const admin = new Redis(setup.redisUrl);
  const stop = async () => {
    admin.disconnect();
    await Promise.all(brokers.map((b) => b.stop()));
    await setup.close();
  };
  try {
    const startedAt = Date.now();
    const first = await startReplica(env, 'scale-a', brokers);
    const second = await startReplica(env, 'scale-b', brokers);
    // Every client's first token (readiness may come before them), then a breath.
    await waitUntil(
      () => new Set(emulator.stats.issued.map((t) => t.clientId)).size >= n,
      60_000,
      `tokens for all ${n} clients`,
    );
    await delay(2000);
    // One full lifetime idle: each client's token is refreshed once in it.
    const idleFrom = Date.now();
    const commandsBefore = await redisCommands(admin);
    const idleCpuBefore = [first, second].map((b) => cpuSecondsOf(b.proc.pid!));
    // VmRSS every second over the second half: its lowest is the replica's idle floor, which
    // a single reading misses by up to ~20 MB while V8 still holds the start-up's young
    // generation, or a refresh is under way.
    const rssFloor = await rssFloors([first.proc, second.proc], opts.lifetimeS * 1000, 0.5);
    const commands = (await redisCommands(admin)) - commandsBefore;
    const idleMs = Date.now() - idleFrom;
    const idleCpuRate = [first, second].map(
      (b, i) => (cpuSecondsOf(b.proc.pid!) - idleCpuBefore[i]) / (idleMs / 1000),
    );
    const rssKb = (rssFloor[0] + rssFloor[1]) / 2;
    const issued = emulator.stats.issued;
    const seen = new Set<string>();
    const startup: number[] = [];
    const refresh: number[] = [];
    for (const t of issued) {
      const id = merchantOf.get(t.clientId) ?? t.clientId;
      (seen.has(id) ? refresh : startup).push(t.issuedAt);
      seen.add(id);
    }
    const cycles = refreshCycles(issued, merchantOf, (opts.lifetimeS - opts.aheadS) * 500);
    const lapses = lapsesOf(issued, merchantOf, opts.lifetimeS * 1000);
    // The load rounds measure the hot path, so they run at the provider's own lifetime: with the
    // idle rows' short tokens a thousand clients refresh some forty times a second under load,
    // which is the refresh rows' business, not GET /token's. Each client's next refresh (due
    // within one short lifetime) brings a long token; then the replica's quiet CPU is taken.
    emulator.setKnobs({ tokenLifetimeSeconds: LOAD_LIFETIME_S });
    const switchedAt = Date.now();
    await waitUntil(
      () =>
        new Set(
          emulator.stats.issued.filter((t) => t.issuedAt >= switchedAt).map((t) => t.clientId),
        ).size >= n,
      opts.lifetimeS * 1000 + 30_000,
      `${LOAD_LIFETIME_S} s tokens for all ${n} clients`,
    );
    await delay(1000);
    const procs = [first.proc, second.proc];
    const quietCpuBefore = procs.map((p) => cpuSecondsOf(p.pid!));
    const quietFrom = performance.now();
    await delay(QUIET_MS);
    const quietS = (performance.now() - quietFrom) / 1000;
    const quietCpuPerS = procs.map((p, i) => (cpuSecondsOf(p.pid!) - quietCpuBefore[i]) / quietS);
    const quietFloor = await rssFloors(procs, QUIET_RSS_MS);
    return {
      run: {
        n,
        readyMs: first.readyMs,
        readyCpuS: first.readyCpuS,
        joinReadyMs: second.readyMs,
        joinReadyCpuS: second.readyCpuS,
        rssKb,
        quietRssKb: (quietFloor[0] + quietFloor[1]) / 2,
        busiestStartup: busiestSecond(startup, startedAt),
        busiestRefresh: busiestSecond(refresh, startedAt),
        requestsPerCycle: cycles.requests / cycles.cycles,
        maxPerCycle: cycles.max,
        lapses,
        redisPerClient: ((commands / n / 2) * (opts.lifetimeS * 1000)) / idleMs,
        idleCpuPerS: idleCpuRate[0] + idleCpuRate[1],
      },
      kept: { procs, quietCpuPerS, ids, apiKey, stop },
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Spawns a replica of the bench's build and times it to readiness (wall and CPU). */
async function startReplica(
  env: Record<string, string>,
  name: string,
  brokers: BrokerProcess[],
): Promise<{ proc: BrokerProcess; readyMs: number; readyCpuS: number }> {
  const started = performance.now();
  const proc = await spawnImageBroker({
    env,
    name,
    admin: true,
    outputToFile: true,
  });
  brokers.push(proc);
  const deadline = started + 120_000;
  for (;;) {
    if (!proc.isRunning()) throw new Error(`${name} exited at start:\n${proc.logs().join('\n')}`);
    if ((await readyStatus(proc.port)) === 200) break;
    if (performance.now() > deadline) {
      throw new Error(`${name} not ready after 120 s:\n${proc.logs().slice(-30).join('\n')}`);
    }
    await delay(POLL_MS);
  }
  return { proc, readyMs: performance.now() - started, readyCpuS: cpuSecondsOf(proc.pid!) };
}

/** Each client's token requests grouped into cycles: requests closer than `gapMs` are one. */
export function refreshCycles(
  issued: ReadonlyArray<{ clientId: string; issuedAt: number }>,
  merchantOf: ReadonlyMap<string, string>,
  gapMs: number,
): { requests: number; cycles: number; max: number } {
  let cycles = 0;
  let max = 0;
  for (const times of timesPerClient(issued, merchantOf).values()) {
    let inCycle = 0;
    let last = -Infinity;
    for (const t of times) {
      if (t - last > gapMs) {
        cycles++;
        inCycle = 0;
      }
      inCycle++;
      max = Math.max(max, inCycle);
      last = t;
    }
  }
  return { requests: issued.length, cycles: Math.max(cycles, 1), max };
}

/** Gaps longer than `lifetimeMs` between two tokens of one client. */
export function lapsesOf(
  issued: ReadonlyArray<{ clientId: string; issuedAt: number }>,
  merchantOf: ReadonlyMap<string, string>,
  lifetimeMs: number,
): number {
  let lapses = 0;
  for (const times of timesPerClient(issued, merchantOf).values()) {
    for (let i = 1; i < times.length; i++) if (times[i] - times[i - 1] > lifetimeMs) lapses++;
  }
  return lapses;
}

function timesPerClient(
  issued: ReadonlyArray<{ clientId: string; issuedAt: number }>,
  merchantOf: ReadonlyMap<string, string>,
): Map<string, number[]> {
  const byClient = new Map<string, number[]>();
  for (const t of issued) {
    const id = merchantOf.get(t.clientId) ?? t.clientId;
    byClient.set(id, [...(byClient.get(id) ?? []), t.issuedAt]);
  }
  for (const times of byClient.values()) times.sort((a, b) => a - b);
  return byClient;
}

/** Commands Redis executed, but for the bench's own `INFO`. */
async function redisCommands(redis: Redis): Promise<number> {
  const info = await redis.info('commandstats');
  let total = 0;
  for (const m of info.matchAll(/^cmdstat_([a-z|_-]+):calls=(\d+)/gm)) {
    if (m[1] !== 'info') total += Number(m[2]);
  }
  return total;
}

/** Most of `times` (epoch ms) falling in one second, counted in seconds from `from`. */
function busiestSecond(times: readonly number[], from: number): number {
  const perSecond = new Map<number, number>();
  for (const t of times) {
    const s = Math.floor((t - from) / 1000);
    perSecond.set(s, (perSecond.get(s) ?? 0) + 1);
  }
  return Math.max(0, ...perSecond.values());
}

/**
 * Each process's lowest VmRSS (KiB), read every second for `ms`, from `skip` of it on (a
 * fraction: the first part of a window may still hold what came before it).
 */
async function rssFloors(procs: BrokerProcess[], ms: number, skip = 0): Promise<number[]> {
  const floors = procs.map(() => Infinity);
  const from = Date.now();
  while (Date.now() - from < ms) {
    await delay(Math.min(1000, ms - (Date.now() - from)));
    if (Date.now() - from < ms * skip) continue;
    procs.forEach((p, i) => (floors[i] = Math.min(floors[i], rssKbOf(p.pid!))));
  }
  return floors;
}

function rssKbOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1]);
}

/** utime + stime of a process, from `/proc/<pid>/stat` (clock ticks of 10 ms on Linux). */
function cpuSecondsOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
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

async function waitUntil(check: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`scale bench: no ${what} after ${timeoutMs} ms`);
    await delay(100);
  }
}

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
