/**
 * @timed: it times brokers under load; only another @timed suite runs beside it (scripts/test.mjs).
 */
import { Redis } from 'ioredis';
import { Agent, request } from 'undici';
import { redisKeys } from '../../src/redis/redis.constants';
import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import { type Fleet, FLEET_CLIENT } from '../support/fleet';
import { figures, httpGet, metricValue, nextRefresh, type TokenBody } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 8;
/**
 * Above half the lifetime, where the broker refreshes instead: a caller's min_ttl (at most
 * this) can then exceed what the token has left before the refresh is due.
 */
const AHEAD_S = 7;
const GRACE_MS = 4000;
/** Long, so that a lock left behind by the stopping replica would still be there after it exits. */
const LOCK_TTL_MS = 8000;
/** Holds the stopping replica's refresh (and its lock) across the SIGTERM. */
const PROVIDER_LATENCY_MS = 1200;
const IN_FLIGHT = 5;
const MIN_TTL_S = 7;
/** Request loops (each with one request in flight), spread round-robin over the replicas. */
const CONCURRENCY = 9;

/**
 * SIGTERM under load (a rolling deploy): requests already in flight finish, even those waiting
 * for the refresh the replica is doing, the refresh lock is released rather than left to
 * expire, and the process exits 0 within the grace period. The other replicas never notice.
 */
describe('SIGTERM under load', () => {
  let fleet: Fleet;
  let raw: Redis;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      env: {
        TOKEN_LOCK_TTL_MS: String(LOCK_TTL_MS),
        TOKEN_WAIT_TIMEOUT_MS: '3000',
        SHUTDOWN_GRACE_MS: String(GRACE_MS),
        PROVIDER_RESPONSE_TIMEOUT_MS: '3000',
      },
    });
    raw = new Redis(fleet.redis.url, { maxRetriesPerRequest: 1 });
  }, 30_000);

  afterAll(async () => {
    raw?.disconnect();
    await fleet?.stop();
  }, 30_000);

  it('finishes in-flight requests, releases the lock and exits 0 within the grace period', async () => {
    const { emulator, brokers } = fleet;
    const [stopping, ...survivors] = brokers;
    const load = startTokenLoad(fleet, { concurrency: CONCURRENCY });
    const { watch } = load;
    try {
      const current = await nextRefresh(emulator, LIFETIME_S * 1000);
      // Callers that need more than the current token has left make `stopping` refresh now,
      // under the lock, with a slow provider: they are in flight when SIGTERM arrives.
      await delay(Math.max(0, current.expiresAt - MIN_TTL_S * 1000 + 300 - Date.now()));
      emulator.setKnobs({ tokenLatencyMs: PROVIDER_LATENCY_MS });
      const locksBefore = await metricValue(stopping.url, 'token_broker_lock_attempts_total', {
        result: 'acquired',
      });
      const requestsBefore = emulator.stats.tokenRequests;
      const inFlight = Array.from({ length: IN_FLIGHT }, () =>
        httpGet(`${stopping.url}/token?client=${FLEET_CLIENT}&min_ttl=${MIN_TTL_S}`, 10_000).then(
          (res) => ({ ...res, receivedAt: Date.now() }),
          (err: unknown) => ({ status: 0, body: String(err), headers: {}, receivedAt: Date.now() }),
        ),
      );
      await waitFor(() => emulator.stats.tokenRequests > requestsBefore, {
        timeoutMs: 3000,
        intervalMs: 5,
        what: 'the stopping replica to ask the provider',
      });
      const locksNow = await metricValue(stopping.url, 'token_broker_lock_attempts_total', {
        result: 'acquired',
      });
      expect(locksNow).toBe(locksBefore + 1);
      expect(await raw.exists(redisKeys.lock(FLEET_CLIENT))).toBe(1);

      const sigtermAt = Date.now();
      const exit = await stopping.kill('SIGTERM');
      const exitMs = Date.now() - sigtermAt;
      const lockAfterExit = await raw.exists(redisKeys.lock(FLEET_CLIENT));
      emulator.setKnobs({ tokenLatencyMs: 0 });
      const answers = await Promise.all(inFlight);
      await delay(LIFETIME_S * 1000 - PROVIDER_LATENCY_MS);
      const result = await load.stop();

      const onStopping = (url: string) => url === stopping.url;
      const survivorFailures = result.failures.filter((f) => !onStopping(f.url));
      const survivorRefusals = watch.refusals.filter((r) => !onStopping(r.url));
      // Before SIGTERM the stopping replica served like the others; after, it refuses (503
      // with `Connection: close`) or is gone, which callers retry elsewhere.
      const refusedBeforeSigterm = watch.refusals.filter(
        (r) => onStopping(r.url) && r.sentAt < sigtermAt - 50,
      );
      const stoppingRefusals = watch.refusals.filter((r) => onStopping(r.url));
      // A request sent on a kept-alive connection just as the server closes it as idle is reset
      // (the server never received it; callers retry it on another replica): at most one per
      // request loop. Everything sent later is refused.
      const stoppingFailures = result.failures.filter((f) => onStopping(f.url));
      const resets = stoppingFailures.filter((f) => !/ECONNREFUSED/.test(f.error));
      console.log(
        figures('sigterm', result, {
          survivorFailures: survivorFailures.length,
          survivorRefusals: survivorRefusals.length,
          stoppingReplicaRefusalsAfterSigterm:
            stoppingRefusals.length - refusedBeforeSigterm.length,
          stoppingReplicaRefused: stoppingFailures.length - resets.length,
          stoppingReplicaResets: resets.length,
          inFlightAnswered: answers.filter((a) => a.status === 200).length,
          providerRequests: emulator.stats.tokenRequests,
          exitCode: String(exit.code),
          exitMs,
          lockKeyAfterExit: lockAfterExit,
        }),
      );

      expect(exit).toMatchObject({ code: 0, signal: null });
      expect(exitMs).toBeLessThan(GRACE_MS);
      expect(lockAfterExit).toBe(0);
      for (const a of answers) {
        expect(a.status).toBe(200);
        const body = JSON.parse(a.body) as TokenBody;
        expect(emulator.isValidToken(body.access_token)).toBe(true);
        expect(Date.parse(body.expires_at) - a.receivedAt).toBeGreaterThanOrEqual(
          MIN_TTL_S * 1000 - 1000,
        );
      }
      expect(result.calls).toBeGreaterThan(1000);
      expect(survivorFailures).toEqual([]);
      expect(survivorRefusals).toEqual([]);
      expect(refusedBeforeSigterm).toEqual([]);
      for (const r of stoppingRefusals) expect(r.status).toBe(503);
      expect(resets.length).toBeLessThanOrEqual(CONCURRENCY);
      expect(result.validationErrors).toEqual([]);
      expect(survivors.every((b) => b.isRunning())).toBe(true);
    } finally {
      await load.stop();
      emulator.setKnobs({ tokenLatencyMs: 0 });
    }
  }, 60_000);

  it('answers an order in flight at SIGTERM with Connection: close, so its keep-alive connection does not hold the exit for the grace period', async () => {
    const { emulator, brokers } = fleet;
    const broker = brokers[1];
    const keepAlive = new Agent({ keepAliveTimeout: 60_000, keepAliveMaxTimeout: 60_000 });
    emulator.setKnobs({ ordersLatencyMs: 1000 });
    try {
      const answer = request(`${broker.url}/orders?client=${FLEET_CLIENT}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ price: 50_000, orderRef: 'in-flight-at-sigterm' }),
        dispatcher: keepAlive,
      });
      // The order is at the provider (1 s) when the signal arrives.
      await delay(300);
      const signalledAt = Date.now();
      const exited = broker.kill('SIGTERM');
      const res = await answer;
      const body = await res.body.text();
      expect(res.statusCode).toBe(201);
      expect(JSON.parse(body)).toMatchObject({ status: 'CREATED' });
      expect(res.headers.connection).toBe('close');
      expect(await exited).toMatchObject({ code: 0, signal: null });
      // Without the header the kept-alive connection would hold the closing server open until
      // the grace period ends.
      expect(Date.now() - signalledAt).toBeLessThan(GRACE_MS);
    } finally {
      emulator.setKnobs({ ordersLatencyMs: 0 });
      await keepAlive.close();
    }
  }, 30_000);
});
