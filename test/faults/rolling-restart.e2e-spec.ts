/**
 * @timed: it times brokers under load; only another @timed suite runs beside it (scripts/test.mjs).
 */
import { request } from 'undici';
import { spawnBroker, type BrokerProcess } from '../support/broker-process';
import { startFaultFleet } from '../support/fault-fleet';
import { type Fleet, FLEET_CLIENT } from '../support/fleet';
import { hammer } from '../support/load';
import { ServiceBalancer } from '../support/service-balancer';
import { delay, waitFor } from '../support/wait';

/** Long: no refresh is due during the restart, so any token request would be an extra one. */
const LIFETIME_S = 120;
const AHEAD_S = 10;
const DRAIN_MS = 1500;
const GRACE_MS = 3000;
/** Endpoints controller + kube-proxy catching up with a deleted pod. */
const PROPAGATION_MS = 500;
const PROBE_INTERVAL_MS = 200;
const CONCURRENCY = 8;

interface Step {
  exit: { code: number | null; signal: NodeJS.Signals | null };
  /** From SIGTERM to the first readiness answer of 503. */
  notReadyAfterMs: number;
  readinessBody: string;
}

/** SIGTERMs each replica in turn, as a Deployment rollout does, with a new one started for it. */
async function rollingRestart(fleet: Fleet, balancer: ServiceBalancer): Promise<Step[]> {
  const steps: Step[] = [];
  const replicas = [...fleet.brokers];
  for (const old of replicas) {
    // The kubelet sends SIGTERM while the endpoints controller removes the pod, in parallel.
    const termAt = Date.now();
    balancer.remove(old.port);
    const exited = old.kill('SIGTERM');
    const readiness = await waitFor(
      async () => {
        // The admin listener: where readiness says why, not only that.
        const res = await request(`${old.adminUrl!}/health/ready`).catch(() => undefined);
        if (res === undefined) return { status: 0, body: '' };
        const body = await res.body.text();
        return res.statusCode === 503 ? { status: 503, body } : null;
      },
      { timeoutMs: 5000, intervalMs: 5, what: `${old.name} to report not ready` },
    );
    const notReadyAfterMs = Date.now() - termAt;
    const replacement: BrokerProcess = await spawnBroker({
      env: fleet.env,
      name: `${old.name}-next`,
    });
    fleet.brokers.push(replacement);
    await replacement.waitReady(15_000);
    balancer.add(replacement.port);
    await waitFor(() => balancer.routable().includes(replacement.port), {
      timeoutMs: 5000,
      what: `${replacement.name} to receive connections`,
    });
    const exit = await exited;
    steps.push({ exit, notReadyAfterMs, readinessBody: readiness.body });
    fleet.brokers.splice(fleet.brokers.indexOf(old), 1);
  }
  return steps;
}

/**
 * A Deployment rollout of a three-replica fleet behind a Service, under load: every replica is
 * SIGTERMed in turn and replaced. With a drain delay longer than the endpoints' propagation,
 * callers see no failure and the provider no extra token request; without one (the control),
 * callers holding connections to the stopping pod, or routed to it before the Service caught
 * up, fail.
 */
describe.each([
  ['with a drain delay', DRAIN_MS],
  ['without a drain delay (control)', 0],
])('rolling restart behind a Service, %s', (_name, drainMs) => {
  let fleet: Fleet;
  let balancer: ServiceBalancer;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      admin: true,
      env: { SHUTDOWN_DRAIN_DELAY_MS: String(drainMs), SHUTDOWN_GRACE_MS: String(GRACE_MS) },
    });
    balancer = await ServiceBalancer.start({
      probeIntervalMs: PROBE_INTERVAL_MS,
      propagationMs: PROPAGATION_MS,
    });
    for (const b of fleet.brokers) balancer.add(b.port);
    await waitFor(() => balancer.routable().length === fleet.brokers.length, {
      timeoutMs: 5000,
      what: 'every replica to receive connections',
    });
  }, 30_000);

  afterAll(async () => {
    await balancer?.close();
    await fleet?.stop();
  }, 30_000);

  it(
    drainMs > 0
      ? 'fails no call and asks the provider for no extra token'
      : 'fails calls (what the drain delay prevents)',
    async () => {
      const requestsBefore = fleet.emulator.stats.tokenRequests;
      let done = false;
      const load = hammer({
        urls: [balancer.url],
        path: `/token?client=${FLEET_CLIENT}`,
        concurrency: CONCURRENCY,
        until: () => done,
        durationMs: 60_000,
        validate: (res) =>
          res.status !== 200 || JSON.parse(res.body).access_token ? null : 'no access_token',
      });
      let steps: Step[];
      try {
        await delay(300);
        steps = await rollingRestart(fleet, balancer);
        await delay(300);
      } finally {
        done = true;
      }
      const result = await load;
      const tokenRequests = fleet.emulator.stats.tokenRequests - requestsBefore;
      process.stdout.write(
        `[fault:rolling-restart] drainMs=${drainMs} propagationMs=${PROPAGATION_MS} calls=${result.calls} ` +
          `failures=${result.failureCount} (${[...new Set(result.failures.map((f) => `${f.status}:${f.error.slice(0, 40)}`))].slice(0, 4).join(' | ')}) ` +
          `byStatus=${JSON.stringify(result.byStatus)} providerTokenRequests=${tokenRequests} ` +
          `exits=${steps.map((s) => s.exit.code).join(',')} notReadyAfterMs=${steps.map((s) => s.notReadyAfterMs).join(',')} ` +
          `noEndpoint=${balancer.noEndpoint}\n`,
      );

      expect(result.calls).toBeGreaterThan(1000);
      expect(result.validationErrors).toEqual([]);
      for (const step of steps) {
        expect(step.exit).toEqual({ code: 0, signal: null });
      }
      if (drainMs > 0) {
        expect(result.failures).toEqual([]);
        expect(result.failureCount).toBe(0);
        expect(tokenRequests).toBe(0);
        for (const step of steps) {
          // Out of the Service at once, saying why.
          expect(step.notReadyAfterMs).toBeLessThan(500);
          expect(JSON.parse(step.readinessBody)).toMatchObject({
            status: 'error',
            error: { lifecycle: { status: 'down', state: 'draining' } },
          });
        }
      } else {
        expect(result.failureCount).toBeGreaterThan(0);
      }
    },
    90_000,
  );
});
