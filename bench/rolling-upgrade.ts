import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { type BrokerProcess, spawnBroker } from '../test/support/broker-process';
import { hammer, type HammerResult } from '../test/support/load';
import { ServiceBalancer } from '../test/support/service-balancer';
import { waitFor } from '../test/support/wait';
import { brokerMain, imageNode } from './paths';
import { lapsesOf, refreshCycles, startScaleSetup } from './scale.bench';

/**
 * `node dist-dev/bench/rolling-upgrade.js --old <dir>`: a rollout from the build in
 * `<dir>/dist/main.js` to this checkout's `dist/main.js` (or `BENCH_BROKER_MAIN`), as a
 * Deployment does it (one surge replica, none unavailable): two replicas of the old build
 * share one Redis behind a Service; each is replaced in turn by a new one, started and ready
 * before the old one is taken out and SIGTERMed, while callers ask `GET /token` for several
 * clients throughout. Old and new replicas share the Redis for a whole token lifetime, so
 * refreshes happen with both kinds in the fleet.
 *
 * It prints the provider's token requests per client per refresh cycle (1.00: no duplicate
 * refresh), gaps longer than a lifetime (a lost token) and failed calls, and exits 1 if any is
 * off. Options: `--clients` (default 5), `--lifetime` seconds (12), `--ahead` seconds (4), and
 * `--new-env NAME=value` (repeatable) for a rollout that changes a setting too: given another
 * `CACHE_KEY_FILE`, the new replicas cannot read the old ones' tokens, and this check fails.
 */

/** Every value of `--name value` / `--name=value`, in order. */
function flags(name: string): string[] {
  const argv = process.argv.slice(2);
  const values: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === `--${name}` && argv[i + 1] !== undefined) values.push(argv[++i]);
    else if (argv[i].startsWith(`--${name}=`)) values.push(argv[i].slice(name.length + 3));
  }
  return values;
}

const flag = (name: string): string | undefined => flags(name).at(-1);

const DRAIN_MS = 1500;
const GRACE_MS = 3000;
/** Endpoints controller + kube-proxy catching up with a deleted pod. */
const PROPAGATION_MS = 500;
const PROBE_INTERVAL_MS = 200;
/** Caller loops per client, each with one request in flight. */
const LOOPS_PER_CLIENT = 2;

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(): Promise<number> {
  const oldDir = flag('old');
  if (oldDir === undefined) {
    console.error('usage: rolling-upgrade --old <folder holding the old build in dist/>');
    return 64;
  }
  const oldMain = resolve(oldDir, 'dist', 'main.js');
  const newMain = brokerMain();
  for (const main of [oldMain, newMain]) {
    if (!existsSync(main)) {
      console.error(`${main} does not exist: build it first (npm run build)`);
      return 66;
    }
  }
  const newOverrides: Record<string, string> = {};
  for (const pair of flags('new-env')) {
    const eq = pair.indexOf('=');
    if (eq <= 0) {
      console.error(`--new-env takes NAME=value (got "${pair}")`);
      return 64;
    }
    newOverrides[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  const clients = Number(flag('clients') ?? 5);
  const lifetimeS = Number(flag('lifetime') ?? 12);
  const aheadS = Number(flag('ahead') ?? 4);
  const setup = await startScaleSetup(clients, lifetimeS);
  const env = {
    ...setup.env,
    TOKEN_REFRESH_AHEAD_SECONDS: String(aheadS),
    // Lifetimes of seconds: the default floor between two grants (5 s) is for production's.
    TOKEN_MIN_REFRESH_INTERVAL_MS: '500',
    SHUTDOWN_DRAIN_DELAY_MS: String(DRAIN_MS),
    SHUTDOWN_GRACE_MS: String(GRACE_MS),
  };
  const balancer = await ServiceBalancer.start({
    probeIntervalMs: PROBE_INTERVAL_MS,
    propagationMs: PROPAGATION_MS,
  });
  const brokers: BrokerProcess[] = [];
  let replicaCount = 0;
  const newEnv = { ...env, ...newOverrides };
  const start = async (script: string, kind: 'old' | 'new'): Promise<BrokerProcess> => {
    const proc = await spawnBroker({
      env: kind === 'old' ? env : newEnv,
      name: `${kind}-${replicaCount++}`,
      script,
      outputToFile: true,
    });
    brokers.push(proc);
    await proc.waitReady(30_000);
    balancer.add(proc.port);
    await waitFor(() => balancer.routable().includes(proc.port), {
      timeoutMs: 5000,
      what: `${proc.name} to receive connections`,
    });
    return proc;
  };
  try {
    console.log(
      `rolling upgrade: old ${oldMain} -> new ${newMain}; ${clients} clients, tokens of ` +
        `${lifetimeS} s refreshed ${aheadS} s ahead, 2 replicas, one Redis`,
    );
    const fleet = [await start(oldMain, 'old'), await start(oldMain, 'old')];
    let done = false;
    const loads: Promise<HammerResult>[] = setup.ids.map((id) =>
      hammer({
        urls: [balancer.url],
        path: `/token?client=${id}`,
        headers: { authorization: `Bearer ${setup.apiKey}` },
        concurrency: LOOPS_PER_CLIENT,
        until: () => done,
        durationMs: 600_000,
        validate: (res) => {
          if (res.status !== 200) return null;
          const token = (JSON.parse(res.body) as { access_token?: string }).access_token;
          if (token === undefined) return 'no access_token';
          return setup.emulator.isValidToken(token)
            ? null
            : 'a token the provider does not hold valid';
        },
      }),
    );
    const startedAt = Date.now();
    const steps: string[] = [];
    try {
      await delay((lifetimeS * 1000) / 2);
      for (let i = 0; i < fleet.length; i++) {
        const old = fleet[i];
        const next = await start(newMain, 'new');
        // The kubelet sends SIGTERM while the endpoints controller removes the pod.
        balancer.remove(old.port);
        const exit = await old.stop(DRAIN_MS + GRACE_MS + 5000);
        steps.push(
          `${old.name} -> ${next.name} at ${((Date.now() - startedAt) / 1000).toFixed(1)} s (old exit ${exit.code ?? exit.signal})`,
        );
        fleet[i] = next;
        // Old and new together (then new alone) for a whole lifetime: refreshes in between.
        await delay(lifetimeS * 1000);
      }
    } finally {
      done = true;
    }
    const results = await Promise.all(loads);
    const spanS = (Date.now() - startedAt) / 1000;
    const issued = setup.emulator.stats.issued;
    const cycles = refreshCycles(issued, setup.merchantOf, (lifetimeS - aheadS) * 500);
    const lapses = lapsesOf(issued, setup.merchantOf, lifetimeS * 1000);
    const calls = results.reduce((s, r) => s + r.calls, 0);
    const failed = results.reduce((s, r) => s + r.failureCount, 0);
    const invalid = results.reduce((s, r) => s + r.validationErrorCount, 0);
    const failures = [
      ...new Set(results.flatMap((r) => r.failures.map((f) => `${f.status}:${f.error}`))),
    ];
    const perCycle = cycles.requests / cycles.cycles;
    for (const s of steps) console.log(`  ${s}`);
    console.log(
      `  ${calls} GET /token calls over ${spanS.toFixed(0)} s (${(spanS / lifetimeS).toFixed(1)} lifetimes); ` +
        `failed calls ${failed} (must be 0)${failures.length > 0 ? `: ${failures.slice(0, 5).join(' | ')}` : ''}; ` +
        `tokens served that the provider did not hold valid ${invalid} (must be 0)`,
    );
    console.log(
      `  provider token requests ${cycles.requests} in ${cycles.cycles} refresh cycles of ${clients} clients: ` +
        `${perCycle.toFixed(2)} per client per lifetime (must be 1.00), at most ${cycles.max} in one cycle; ` +
        `${lapses} gaps longer than a lifetime (must be 0)`,
    );
    const ok = failed === 0 && invalid === 0 && cycles.max === 1 && lapses === 0 && calls > 0;
    console.log(ok ? 'rolling upgrade: OK' : 'rolling upgrade: FAILED');
    return ok ? 0 : 1;
  } finally {
    await Promise.all(brokers.map((b) => b.stop()));
    await balancer.close();
    await setup.close();
  }
}

// Killed (Ctrl-C): exit through 'exit', whose hook kills every broker and Redis started here.
process.once('SIGINT', () => process.exit(130));
process.once('SIGTERM', () => process.exit(143));

// On the image's Node, as replicas run (and as `npm run bench` does), brokers included.
const image = imageNode();
if (image && image.path !== process.execPath && process.env.BENCH_NODE !== 'current') {
  console.log(
    `rolling upgrade: on the image's Node ${image.major} (BENCH_NODE=current stays here)`,
  );
  const run = spawnSync(image.path, process.argv.slice(1), {
    stdio: 'inherit',
    env: { ...process.env, BENCH_NODE: 'current' },
  });
  process.exit(run.status ?? 1);
}
main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
