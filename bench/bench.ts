import { type ChildProcess, fork, spawnSync } from 'node:child_process';
import { availableParallelism, loadavg } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { freePort } from '../test/support/ports';
import { hammer } from '../test/support/load';
import { createServer as createHttpServer, type Server } from 'node:http';
import { startAuthBrokers, TRACED_TARGET } from './auth.bench';
import { benchOrders } from './orders.bench';
import { loadWithLatency } from './latency';
import { imageNode } from './paths';
import { benchReplica, REPLICA_TARGETS, replicaNodes } from './replica.bench';
import { FLEET_CLIENT, requestsPerCycle, startFleet } from '../test/support/fleet';
import { benchScale, LOAD_LIFETIME_S, QUIET_RSS_MS, type ScaleRun } from './scale.bench';

/**
 * `npm run bench`: the broker against baselines measured in the same run, same load generator
 * and settings, interleaved so drift on a shared machine hits both alike.
 */

const DURATION_SEC = Number(process.env.BENCH_DURATION_SEC ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
/** Idle time over which the brokers' background Redis traffic is measured. */
const IDLE_MS = 5000;

interface Row {
  name: string;
  reqPerSec: number;
  p50Ms: number;
  p99Ms: number;
}

async function load(
  url: string,
  headers?: Record<string, string>,
  method?: 'GET' | 'POST',
  body?: string,
): Promise<Row> {
  const { result: r, latency } = await loadWithLatency({
    url,
    connections: CONNECTIONS,
    duration: DURATION_SEC,
    headers,
    // autocannon takes an explicit `undefined` as a method, not as its default.
    method: method ?? 'GET',
    ...(body === undefined ? {} : { body }),
  });
  if (r.non2xx > 0 || r.errors > 0) {
    throw new Error(`${url}: ${r.non2xx} non-2xx answers and ${r.errors} errors under load`);
  }
  return { name: url, reqPerSec: r.requests.average, ...latency };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** `met` or `NOT met`, for a figure printed beside its target. */
function verdict(met: boolean): string {
  return met ? 'met' : 'NOT met';
}

/**
 * Median over the rounds of `broker / baseline` (req/s, and p99 latency): each round loads both
 * back to back, so a round's ratio is measured under one load of the machine, and the median
 * drops the round another process disturbed most.
 */
function roundRatios(broker: Row[], baseline: Row[]): { reqPerSec: number; p99: number } {
  return {
    reqPerSec: median(broker.map((r, i) => r.reqPerSec / baseline[i].reqPerSec)),
    p99: median(broker.map((r, i) => r.p99Ms / Math.max(baseline[i].p99Ms, 0.001))),
  };
}

/** The floor for `GET /token` with caller authentication, against a bare server. */
const AUTH_TARGETS = { reqPerSec: 0.72, p99: 1.5 } as const;

function mean(rows: Row[], name: string): Row {
  const avg = (f: (r: Row) => number) => rows.reduce((s, r) => s + f(r), 0) / rows.length;
  return {
    name,
    reqPerSec: avg((r) => r.reqPerSec),
    p50Ms: avg((r) => r.p50Ms),
    p99Ms: avg((r) => r.p99Ms),
  };
}

/** The bare server (`bare-server.ts`), answering a constant body of `size` bytes. */
function startBare(port: number, size: number): Promise<ChildProcess> {
  const child = fork(join(__dirname, 'bare-server.js'), [String(port), String(size)], {
    stdio: ['ignore', 'ignore', 'ignore', 'ipc'],
  });
  return new Promise((resolve, reject) => {
    child.once('message', () => resolve(child));
    child.once('exit', (code) => reject(new Error(`bare server exited with ${code}`)));
  });
}

/** Commands Redis executed, leaving out the broker's health pings and our own INFO calls. */
async function redisCommands(redis: Redis): Promise<number> {
  const info = await redis.info('commandstats');
  let total = 0;
  for (const m of info.matchAll(/^cmdstat_([a-z|]+):calls=(\d+)/gm)) {
    if (!['ping', 'info', 'client|setname', 'client', 'hello', 'select'].includes(m[1]))
      total += Number(m[2]);
  }
  return total;
}

/**
 * `GET /token` against the bare baseline; with `withAuth`, also the api-key and kubernetes
 * brokers (audit on). Every target is loaded once per round, rounds interleaved, so drift on a
 * shared machine hits the baseline and each broker alike.
 */
async function benchToken(withAuth: boolean): Promise<void> {
  const fleet = await startFleet({ size: 1, env: { LOG_LEVEL: 'error' } });
  const broker = fleet.brokers[0];
  const sample = await fetch(`${broker.url}/token`);
  const size = (await sample.text()).length;
  const bare = await (async () => {
    const port = await freePort();
    return { url: `http://127.0.0.1:${port}/`, child: await startBare(port, size) };
  })();
  // The traced broker's spans go to a local OTLP/HTTP sink that counts them.
  const sink = withAuth ? await startSpanSink() : undefined;
  const auth = withAuth ? await startAuthBrokers({ otlpEndpoint: sink?.url }) : undefined;
  const redis = new Redis(fleet.redis.url);
  try {
    const tokenUrl = `${broker.url}/token?client=${FLEET_CLIENT}`;
    // Each authenticated broker is compared with the bare server receiving the very same
    // request (its Authorization header included): a service-account token is ~1 KiB that the
    // load generator writes and every server parses, whatever it does with it.
    const authPairs = (auth?.targets ?? []).map((t) => ({
      broker: t,
      bare: {
        name: `bare node:http, ${t.name.replace(/^GET \/token, /, '')} request`,
        url: bare.url,
        headers: t.headers,
        method: t.method,
        body: t.body,
      },
    }));
    const targets: Array<{
      name: string;
      url: string;
      headers?: Record<string, string>;
      method?: 'GET' | 'POST';
      body?: string;
    }> = [
      { name: 'bare node:http (constant body)', url: bare.url },
      { name: 'broker GET /token (auth none, audit off)', url: tokenUrl },
      ...authPairs.flatMap((p) => [p.bare, p.broker]),
    ];
    // Warm every target (JIT, keep-alive pools, the kubernetes caller's first verification).
    for (const t of targets) {
      await autocannon({
        url: t.url,
        headers: t.headers,
        method: t.method ?? 'GET',
        ...(t.body === undefined ? {} : { body: t.body }),
        connections: CONNECTIONS,
        duration: 1,
      });
    }
    const samples = targets.map(() => [] as Row[]);
    // The brokers talk to Redis without any request too (health ping, continuity check, clock
    // samples): measure that background while idle, and count only what exceeds it.
    const idleStart = await redisCommands(redis);
    const idleStartedAt = Date.now();
    await new Promise((resolve) => setTimeout(resolve, IDLE_MS));
    const idleRate = ((await redisCommands(redis)) - idleStart) / (Date.now() - idleStartedAt);
    const commandsBefore = await redisCommands(redis);
    // Spans still queued from start-up (the first token) are exported within the idle time.
    const spansBefore = sink?.spans ?? 0;
    const roundsStartedAt = Date.now();
    for (let i = 0; i < ROUNDS; i++) {
      for (let j = 0; j < targets.length; j++) {
        const t = targets[j];
        samples[j].push(await load(t.url, t.headers, t.method, t.body));
      }
    }
    const total = (await redisCommands(redis)) - commandsBefore;
    // The batch processor exports every OTEL_BSP_SCHEDULE_DELAY (200 ms): wait for the last.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const spansDuringRounds = (sink?.spans ?? 0) - spansBefore;
    const background = Math.round(idleRate * (Date.now() - roundsStartedAt));
    const commands = Math.max(0, total - background);
    const rows = targets.map((t, j) => mean(samples[j], t.name));
    const samplesOf = (target: (typeof targets)[number]) => samples[targets.indexOf(target)];
    printRows('GET /token vs bare node:http (mean of the rounds)', rows.slice(0, 2));
    const plain = roundRatios(samples[1], samples[0]);
    console.log(
      `  median of ${ROUNDS} rounds: req/s ${plain.reqPerSec.toFixed(3)}x (target >= 0.85: ${verdict(plain.reqPerSec >= 0.85)}), ` +
        `p99 ${plain.p99.toFixed(2)}x (target <= 1.5: ${verdict(plain.p99 <= 1.5)})`,
    );
    const brokerRequests = samples[1].reduce((sum, r) => sum + r.reqPerSec * DURATION_SEC, 0);
    console.log(
      `  Redis commands during ${Math.round(brokerRequests)} GET /token: ${commands} beyond the ` +
        `idle background (${total} in all, ${background} expected from ${IDLE_MS / 1000} s idle) ` +
        `(${(commands / brokerRequests).toFixed(6)} per request; target 0)`,
    );
    if (authPairs.length > 0) {
      const authRows = rows.slice(2);
      printRows(
        'GET /token and POST /oauth2/token with caller authentication (audit log on, LOG_LEVEL=info), same rounds',
        authRows,
      );
      for (const pair of authPairs) {
        const r = roundRatios(samplesOf(pair.broker), samplesOf(pair.bare));
        const headerless = roundRatios(samplesOf(pair.broker), samples[0]);
        // The targets are for GET /token; the token endpoint's figures are for information.
        const targeted = pair.broker.method !== 'POST';
        console.log(
          `  ${pair.broker.name}: median of ${ROUNDS} rounds ${r.reqPerSec.toFixed(3)}x the bare server's req/s for the same request` +
            (targeted
              ? ` (target >= ${AUTH_TARGETS.reqPerSec}: ${verdict(r.reqPerSec >= AUTH_TARGETS.reqPerSec)})`
              : '') +
            `, p99 ${r.p99.toFixed(2)}x` +
            (targeted
              ? ` (target <= ${AUTH_TARGETS.p99}: ${verdict(r.p99 <= AUTH_TARGETS.p99)})`
              : '') +
            `; ${headerless.reqPerSec.toFixed(3)}x the header-less baseline`,
        );
      }
      // The L1 hit creates no span, so tracing on leaves the hot path as it was.
      const traced = authPairs.find((p) => p.broker.name === TRACED_TARGET);
      const untraced = authPairs.find((p) => p.broker.name === 'GET /token, api-key caller');
      if (traced && untraced) {
        const r = roundRatios(samplesOf(traced.broker), samplesOf(untraced.broker));
        const requests = samplesOf(traced.broker).reduce(
          (s, x) => s + x.reqPerSec * DURATION_SEC,
          0,
        );
        console.log(
          `  tracing on vs off (api-key broker, same request): median of ${ROUNDS} rounds ${r.reqPerSec.toFixed(3)}x req/s ` +
            `(target >= 0.95: ${verdict(r.reqPerSec >= 0.95)}), p99 ${r.p99.toFixed(2)}x; spans exported during ` +
            `${Math.round(requests)} traced GET /token: ${spansDuringRounds} (target 0: ${verdict(spansDuringRounds === 0)}; ` +
            `${sink?.spans ?? 0} in all, those of the first token: the exporter works)`,
        );
      }
    }
  } finally {
    redis.disconnect();
    bare.child.kill('SIGKILL');
    await auth?.stop();
    await sink?.close();
    await fleet.stop();
  }
}

/** An OTLP/HTTP (JSON) trace receiver that counts the spans it is sent and drops them. */
async function startSpanSink(): Promise<{ url: string; spans: number; close(): Promise<void> }> {
  const sink = { url: '', spans: 0, close: () => Promise.resolve() };
  const server: Server = createHttpServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
          resourceSpans?: Array<{ scopeSpans?: Array<{ spans?: unknown[] }> }>;
        };
        for (const rs of body.resourceSpans ?? []) {
          for (const ss of rs.scopeSpans ?? []) sink.spans += ss.spans?.length ?? 0;
        }
      } catch {
        // Not JSON: not ours to count.
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  const port = await freePort();
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  sink.url = `http://127.0.0.1:${port}`;
  sink.close = () => new Promise<void>((resolve) => server.close(() => resolve()));
  return sink;
}

async function benchFleet(): Promise<void> {
  const lifetime = 4;
  const fleet = await startFleet({
    size: 5,
    knobs: { tokenLifetimeSeconds: lifetime },
    env: { TOKEN_REFRESH_AHEAD_SECONDS: '2', TOKEN_DEFAULT_LIFETIME_SECONDS: '4' },
  });
  try {
    const result = await hammer({
      urls: fleet.brokers.map((b) => b.url),
      path: '/token',
      concurrency: 20,
      durationMs: lifetime * 1000 * 5,
    });
    const cycles = requestsPerCycle(fleet.emulator.stats.tokenRequestTimes, 1000);
    printRows('fleet: 5 replicas, one Redis, token lifetime 4 s, 20 s of load', []);
    console.log(
      `  ${result.calls} calls, ${result.failures.length} failed; provider token requests ${fleet.emulator.stats.tokenRequests} ` +
        `in ${cycles.length} refresh cycles: max ${Math.max(...cycles)} per cycle (target 1)`,
    );
  } finally {
    await fleet.stop();
  }
}

function printRows(title: string, rows: Row[]): void {
  console.log(`\n## ${title}`);
  for (const r of rows) {
    console.log(
      `  ${r.name.padEnd(40)} ${r.reqPerSec.toFixed(0).padStart(8)} req/s   p50 ${r.p50Ms.toFixed(3)} ms   p99 ${r.p99Ms.toFixed(3)} ms`,
    );
  }
}

/** `--name value` or `--name=value` from the command line (`npm run bench -- --only scale`). */
function flag(name: string): string | undefined {
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === `--${name}`) return argv[i + 1];
    if (argv[i].startsWith(`--${name}=`)) return argv[i].slice(name.length + 3);
  }
  return undefined;
}

/** Sections to run: `BENCH_ONLY=token,auth` (or `--only token,auth`) runs just those. */
const SECTIONS = new Set(
  (flag('only') ?? process.env.BENCH_ONLY ?? 'token,auth,orders,fleet,replica,scale').split(','),
);

/** Start-to-ready and idle RSS of one replica, on this Node and on the image's. */
async function benchReplicaSection(): Promise<void> {
  const starts = Number(process.env.BENCH_REPLICA_STARTS ?? 5);
  const idleMs = Number(process.env.BENCH_REPLICA_IDLE_MS ?? 3000);
  const settleMs = Number(process.env.BENCH_REPLICA_SETTLE_MS ?? 120_000);
  const rows = await benchReplica({ starts, idleMs, settleMs, nodes: replicaNodes() });
  console.log(
    `\n## One replica: spawn to /health/ready 200 (wall, and the broker's CPU time), VmRSS ${idleMs / 1000} s after ready (median of ${starts} starts), and settled (V8's idle memory reducer done; one start each, at most ${settleMs / 1000} s)`,
  );
  for (const r of rows) {
    const settled =
      r.settledRssMb === undefined
        ? ''
        : `, settled ${r.settledRssMb.toFixed(1).padStart(6)} MB after ${r.settledAfterS!.toFixed(0)} s`;
    console.log(
      `  ${`${r.name}, ${r.node}`.padEnd(52)} ready ${r.readyMs.toFixed(0).padStart(5)} ms, ${r.readyCpuMs.toFixed(0).padStart(5)} ms CPU (target <= ${REPLICA_TARGETS.readyMs}: ${verdict(r.readyMs <= REPLICA_TARGETS.readyMs)}, CPU ${verdict(r.readyCpuMs <= REPLICA_TARGETS.readyMs)})   ` +
        `idle RSS ${r.idleRssMb.toFixed(1).padStart(6)} MB${settled} (target <= ${REPLICA_TARGETS.idleRssMb}: ${verdict(r.idleRssMb <= REPLICA_TARGETS.idleRssMb)}` +
        `${r.settledRssMb === undefined ? '' : `, settled ${verdict(r.settledRssMb <= REPLICA_TARGETS.idleRssMb)}`})`,
    );
  }
}

async function benchOrdersSection(): Promise<void> {
  const connections = 20;
  const report = await benchOrders({ durationSec: DURATION_SEC, connections, rounds: ROUNDS });
  const [direct, floor, broker] = report.instant;
  printRows(
    `POST /orders, emulator answering at once (CPU-bound; ${connections} connections)`,
    report.instant,
  );
  const vsFloor = broker.reqPerSec / floor.reqPerSec;
  console.log(
    `  broker ${(broker.reqPerSec / direct.reqPerSec).toFixed(3)}x the direct req/s (target >= 0.7: ${verdict(broker.reqPerSec / direct.reqPerSec >= 0.7)}); ` +
      `the bare forwarder, the floor for any Node process in the path, ${(floor.reqPerSec / direct.reqPerSec).toFixed(3)}x; ` +
      `broker ${vsFloor.toFixed(3)}x the bare forwarder (target >= 0.9: ${verdict(vsFloor >= 0.9)})`,
  );
  const [seqDirect, seqFloor, seqBroker] = report.sequential;
  console.log(
    `\n## POST /orders, one caller sending orders one at a time (${seqDirect.requests} each, emulator answering at once)`,
  );
  for (const r of report.sequential) {
    console.log(
      `  ${r.name.padEnd(40)} p50 ${(r.p50Us / 1000).toFixed(3)} ms   p99 ${(r.p99Us / 1000).toFixed(3)} ms`,
    );
  }
  const [p50Over, p99Over] = [
    (seqBroker.p50Us - seqDirect.p50Us) / 1000,
    (seqBroker.p99Us - seqDirect.p99Us) / 1000,
  ];
  console.log(
    `  p50 overhead ${p50Over.toFixed(3)} ms (target <= 1: ${verdict(p50Over <= 1)}), ` +
      `p99 overhead ${p99Over.toFixed(3)} ms (target <= 0.5: ${verdict(p99Over <= 0.5)}); ` +
      `the bare forwarder's p50 / p99 overhead ${((seqFloor.p50Us - seqDirect.p50Us) / 1000).toFixed(3)} / ${((seqFloor.p99Us - seqDirect.p99Us) / 1000).toFixed(3)} ms, ` +
      `so the broker's own ${((seqBroker.p50Us - seqFloor.p50Us) / 1000).toFixed(3)} / ${((seqBroker.p99Us - seqFloor.p99Us) / 1000).toFixed(3)} ms`,
  );
  // --- Provider passthrough ---
  const [getDirect, getFloor, getBroker] = report.forwarded;
  printRows(
    `Forwarded GET /provider/<client>/api/marketing/v1/offers, emulator answering at once (${connections} connections)`,
    report.forwarded,
  );
  console.log(
    `  broker ${(getBroker.reqPerSec / getDirect.reqPerSec).toFixed(3)}x the direct req/s; ` +
      `the bare forwarder ${(getFloor.reqPerSec / getDirect.reqPerSec).toFixed(3)}x; ` +
      `broker ${(getBroker.reqPerSec / getFloor.reqPerSec).toFixed(3)}x the bare forwarder`,
  );
  // --- end provider passthrough ---
  const [delayedDirect, delayedFloor, delayedBroker] = report.delayed;
  printRows(
    `POST /orders, emulator taking time per order (${connections} connections)`,
    report.delayed,
  );
  console.log(
    `  broker ${(delayedBroker.reqPerSec / delayedDirect.reqPerSec).toFixed(3)}x the direct req/s (target >= 0.85: ${verdict(delayedBroker.reqPerSec / delayedDirect.reqPerSec >= 0.85)}), ` +
      `p50 overhead ${(delayedBroker.p50Ms - delayedDirect.p50Ms).toFixed(3)} ms (target <= 1: ${verdict(delayedBroker.p50Ms - delayedDirect.p50Ms <= 1)}); ` +
      `the bare forwarder ${(delayedFloor.reqPerSec / delayedDirect.reqPerSec).toFixed(3)}x, p50 overhead ${(delayedFloor.p50Ms - delayedDirect.p50Ms).toFixed(3)} ms`,
  );
}

async function main(): Promise<void> {
  console.log(
    `bench: ${CONNECTIONS} connections, ${DURATION_SEC} s x ${ROUNDS} interleaved rounds, Node ${process.version}, ` +
      `load average ${loadavg()
        .map((l) => l.toFixed(2))
        .join(' ')} on ${availableParallelism()} CPUs (other processes skew every ratio)`,
  );
  if (SECTIONS.has('token') || SECTIONS.has('auth')) await benchToken(SECTIONS.has('auth'));
  if (SECTIONS.has('orders')) await benchOrdersSection();
  if (SECTIONS.has('fleet')) await benchFleet();
  if (SECTIONS.has('replica')) await benchReplicaSection();
  if (SECTIONS.has('scale')) await benchScaleSection();
}

/** The targets of issue #36 at the largest N. */
const SCALE_TARGETS = {
  rssKbPerClient: 20,
  busiestVsEvenShare: 2,
  tokenPerCpuVsOne: 0.9,
  metricsBytes: 100 * 1024,
} as const;

/**
 * N clients on one provider (`--clients 1,100,1000`, `BENCH_SCALE_CLIENTS`), two replicas, one
 * Redis; every row also as a ratio against the first N of the same run.
 */
async function benchScaleSection(): Promise<void> {
  const clients = (flag('clients') ?? process.env.BENCH_SCALE_CLIENTS ?? '1,100,1000')
    .split(',')
    .map(Number);
  if (clients.some((n) => !Number.isInteger(n) || n < 1)) {
    throw new Error('--clients takes whole numbers of at least 1, comma-separated (1,100,1000)');
  }
  const lifetimeS = Number(process.env.BENCH_SCALE_LIFETIME_SEC ?? 40);
  const aheadS = Number(process.env.BENCH_SCALE_AHEAD_SEC ?? 10);
  const startedAt = Date.now();
  const runs = await benchScale({
    clients,
    lifetimeS,
    aheadS,
    durationSec: DURATION_SEC,
    rounds: ROUNDS,
    connections: CONNECTIONS,
  });
  printScale(runs, { lifetimeS, aheadS });
  console.log(`  (section took ${((Date.now() - startedAt) / 1000).toFixed(0)} s)`);
}

function printScale(runs: ScaleRun[], opts: { lifetimeS: number; aheadS: number }): void {
  const base = runs[0];
  const last = runs[runs.length - 1];
  console.log(
    `\n## Scale: N clients on one provider, 2 replicas, one Redis, file credentials, an api-key ` +
      `caller granted every client; tokens of ${opts.lifetimeS} s refreshed ${opts.aheadS} s ahead ` +
      `(ratios against N=${base.n} of this run)`,
  );
  const ratio = (v: number, b: number) => (b > 0 ? ` (${(v / b).toFixed(2)}x)` : '');
  const header = `| row | ${runs.map((r) => `N=${r.n}`).join(' | ')} | target |`;
  console.log(`  ${header}`);
  console.log(`  |---|${runs.map(() => '---|').join('')}---|`);
  const row = (name: string, cells: string[], target: string) =>
    console.log(`  | ${name} | ${cells.join(' | ')} | ${target} |`);
  row(
    'cold replica ready (empty Redis)',
    runs.map(
      (r) =>
        `${(r.readyMs / 1000).toFixed(2)} s${ratio(r.readyMs, base.readyMs)}, ` +
        `${r.readyCpuS.toFixed(2)} CPU-s${ratio(r.readyCpuS, base.readyCpuS)}`,
    ),
    'not growing badly',
  );
  row(
    'second replica ready (joining)',
    runs.map(
      (r) =>
        `${(r.joinReadyMs / 1000).toFixed(2)} s${ratio(r.joinReadyMs, base.joinReadyMs)}, ` +
        `${r.joinReadyCpuS.toFixed(2)} CPU-s${ratio(r.joinReadyCpuS, base.joinReadyCpuS)}`,
    ),
    '(information)',
  );
  /** KiB per client past the first N, of `kb` (the idle or the quiet RSS). */
  const perClient = (r: ScaleRun, kb: (run: ScaleRun) => number = (run) => run.rssKb) =>
    r.n === base.n ? 0 : (kb(r) - kb(base)) / (r.n - base.n);
  row(
    `RSS, idle replica (mean of 2, lowest in the 2nd half of ${opts.lifetimeS} s idle, before any load); per additional client`,
    runs.map(
      (r, i) =>
        `${(r.rssKb / 1024).toFixed(1)} MB${ratio(r.rssKb, base.rssKb)}` +
        (r.n === base.n ? '' : `; ${perClient(r).toFixed(1)} KB per client`) +
        // Beyond the second N, what each client past the one before costs: the first N's
        // baseline has not run the code a burst of clients warms (undici's pool, pipelines).
        (i < 2 || r.n <= runs[i - 1].n
          ? ''
          : `, ${((r.rssKb - runs[i - 1].rssKb) / (r.n - runs[i - 1].n)).toFixed(1)} KB from N=${runs[i - 1].n}`),
    ),
    `<= ${SCALE_TARGETS.rssKbPerClient} KB per client: ${verdict(perClient(last) <= SCALE_TARGETS.rssKbPerClient)}`,
  );
  const quietPerClient = (r: ScaleRun) => perClient(r, (run) => run.quietRssKb);
  row(
    `RSS, quiet replica (mean of 2, lowest in ${QUIET_RSS_MS / 1000} s with every client on a ${LOAD_LIFETIME_S / 60}-minute token, no refresh due, as in production); per additional client`,
    runs.map(
      (r) =>
        `${(r.quietRssKb / 1024).toFixed(1)} MB${ratio(r.quietRssKb, base.quietRssKb)}` +
        (r.n === base.n ? '' : `; ${quietPerClient(r).toFixed(1)} KB per client`),
    ),
    '(information)',
  );
  const evenShare = (r: ScaleRun) => r.n / opts.aheadS;
  row(
    `busiest second of the refresh wave (token requests/s; even share N/${opts.aheadS} s)`,
    runs.map(
      (r) =>
        `${r.busiestRefresh}${ratio(r.busiestRefresh, base.busiestRefresh)}; ` +
        `even share ${evenShare(r).toFixed(1)}, ${(r.busiestRefresh / evenShare(r)).toFixed(2)}x it`,
    ),
    `<= ${SCALE_TARGETS.busiestVsEvenShare}x the even share: ${verdict(last.busiestRefresh <= SCALE_TARGETS.busiestVsEvenShare * evenShare(last))}`,
  );
  row(
    "busiest second at start-up (each client's first token)",
    runs.map((r) => `${r.busiestStartup}${ratio(r.busiestStartup, base.busiestStartup)}`),
    '(information)',
  );
  row(
    'token requests per client per refresh cycle (max in one cycle; lapses)',
    runs.map((r) => `${r.requestsPerCycle.toFixed(2)} (max ${r.maxPerCycle}; ${r.lapses} lapses)`),
    '1.00, max 1, 0 lapses',
  );
  row(
    'Redis commands per client per lifetime per replica, idle',
    runs.map(
      (r) => `${r.redisPerClient.toFixed(1)}${ratio(r.redisPerClient, base.redisPerClient)}`,
    ),
    '(O(1) per client)',
  );
  row(
    'broker CPU while idle (both replicas, CPU-s per s: refreshes, timers)',
    runs.map((r) => `${r.idleCpuPerS.toFixed(3)}${ratio(r.idleCpuPerS, base.idleCpuPerS)}`),
    '(information)',
  );
  row(
    `GET /token, random client, tokens of ${LOAD_LIFETIME_S} s: requests per broker CPU-second beyond its quiet CPU (all of it); median of ${ROUNDS} interleaved rounds, ratio per round`,
    runs.map(
      (r) =>
        `${r.tokenPerCpuS.toFixed(0)} (${r.tokenVsFirst.toFixed(2)}x) ` +
        `(${r.tokenPerCpuSRaw.toFixed(0)}${ratio(r.tokenPerCpuSRaw, base.tokenPerCpuSRaw)})` +
        (r.tokenNon2xx > 0 ? `, ${r.tokenNon2xx} of ${r.tokenRequests} failed` : ''),
    ),
    `>= ${SCALE_TARGETS.tokenPerCpuVsOne}x N=${base.n}: ${verdict(last.tokenVsFirst >= SCALE_TARGETS.tokenPerCpuVsOne)}`,
  );
  row(
    '/metrics body',
    runs.map(
      (r) => `${(r.metricsBytes / 1024).toFixed(1)} KB${ratio(r.metricsBytes, base.metricsBytes)}`,
    ),
    `<= 100 KB: ${verdict(last.metricsBytes <= SCALE_TARGETS.metricsBytes)}`,
  );
}

/**
 * The bench runs on the image's Node, as replicas do: on Node 20 most broker processes serve
 * `GET /token` about a fifth slower than the others, for their whole life, in Node's own
 * `process.nextTick` (docs/benchmarks.md); the image's Node does not. Elsewhere it runs itself
 * again there, every process it starts included, unless `BENCH_NODE=current`; the replica
 * section still measures this Node too. Returns that run's exit status, if there was one.
 */
function runOnImageNode(): number | undefined {
  if (process.env.BENCH_NODE === 'current') return undefined;
  const image = imageNode();
  if (!image || image.path === process.execPath) return undefined;
  console.log(
    `bench: on the image's Node ${image.major} (BENCH_NODE=current stays on ${process.version})`,
  );
  const run = spawnSync(image.path, process.argv.slice(1), {
    stdio: 'inherit',
    env: {
      ...process.env,
      BENCH_NODE: 'current',
      BENCH_REPLICA_NODE: process.env.BENCH_REPLICA_NODE ?? process.execPath,
    },
  });
  return run.status ?? 1;
}

// Killed (Ctrl-C): exit through 'exit', whose hook kills every broker, emulator and Redis this
// bench started, and removes their folders.
process.once('SIGINT', () => process.exit(130));
process.once('SIGTERM', () => process.exit(143));

const status = runOnImageNode();
if (status !== undefined) process.exit(status);
main().then(
  () => {
    console.log(
      `\nload average at the end ${loadavg()
        .map((l) => l.toFixed(2))
        .join(' ')}`,
    );
    process.exit(0);
  },
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
