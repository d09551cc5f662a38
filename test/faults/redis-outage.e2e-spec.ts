/**
 * @alone: it times brokers under load; no other suite runs beside it (scripts/test.mjs).
 */
import { Redis } from 'ioredis';
import { redisKeys } from '../../src/redis/redis.constants';
import { shortestRefreshMs } from '../../src/token/refresh-schedule';
import { fingerprintOf } from '../../src/token/token-record';
import { FaultProxy } from '../support/fault-proxy';
import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import { type Fleet, FLEET_CLIENT, requestsPerCycle } from '../support/fleet';
import { startRedis, type TestRedis } from '../support/redis/standalone';
import { currentToken, figures, httpGet, metricValue } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 4;
/**
 * Longer than the broker's minimum serving time (1 s) plus the command timeout: a replica
 * refreshing on its own first waits out a Redis read, and its callers must not wait with it.
 */
const AHEAD_S = 2;
const COMMAND_TIMEOUT_MS = 300;
/**
 * Event-loop and scheduling slack on top of the command timeout: at least this, or the slowest
 * answer seen before the outage when the machine is busier than that.
 */
const LATENCY_MARGIN_MS = 250;
const BLACKHOLE_MS = 4000;
const DOWN_MS = 4000;

/**
 * Design, "Redis down": serve from L1, refresh per replica (at most once per lifetime),
 * report degraded, and resynchronise L2 when Redis returns. Redis sits behind a fault proxy:
 * first blackholed (commands hang until the command timeout), then killed (connections fail
 * at once), for more than two token lifetimes in all, then restarted empty.
 */
describe('Redis blackholed, then killed, for longer than a token lifetime', () => {
  let redis: TestRedis;
  let proxy: FaultProxy;
  let fleet: Fleet;

  beforeAll(async () => {
    redis = await startRedis({ forceLocal: true });
    proxy = await FaultProxy.start({ target: { host: redis.host, port: redis.port } });
    fleet = await startFaultFleet({
      admin: true,
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      redis,
      env: {
        REDIS_URL: proxy.url('redis'),
        REDIS_COMMAND_TIMEOUT_MS: String(COMMAND_TIMEOUT_MS),
        REDIS_PING_INTERVAL_MS: '200',
        TOKEN_LOCK_TTL_MS: '1000',
        TOKEN_WAIT_TIMEOUT_MS: '1000',
        TOKEN_BACKOFF_BASE_MS: '50',
        TOKEN_BACKOFF_MAX_MS: '500',
      },
    });
  }, 30_000);

  afterAll(async () => {
    await fleet?.stop();
    await proxy?.close();
    await redis?.stop();
  }, 30_000);

  it('keeps serving, refreshes at most once per cycle per replica, and converges when Redis returns', async () => {
    const urls = fleet.brokers.map((b) => b.url);
    // Metrics and the readiness report are on the admin listeners.
    const admins = fleet.brokers.map((b) => b.adminUrl!);
    const fetched = () =>
      Promise.all(
        admins.map((u) => metricValue(u, 'token_broker_refresh_total', { result: 'fetched' })),
      );
    // Slowest answer before the outage (Redis fine) and during it: the difference is what
    // waiting on Redis would add; the baseline is what a busy machine adds anyway.
    let outageFrom = Infinity;
    let baselineMaxMs = 0;
    let outageMaxMs = 0;
    const load = startTokenLoad(fleet, {
      observe: (res) => {
        if (res.receivedAt - res.latencyMs < outageFrom) {
          baselineMaxMs = Math.max(baselineMaxMs, res.latencyMs);
        } else {
          outageMaxMs = Math.max(outageMaxMs, res.latencyMs);
        }
      },
    });
    const { watch } = load;

    await delay(LIFETIME_S * 1000); // steady state first: one shared token
    const before = await fetched();
    const requestsBefore = fleet.emulator.stats.tokenRequests;
    const outageStart = Date.now();
    outageFrom = outageStart;
    // When each replica fetched a token of its own: its counter, polled every 100 ms.
    const fetchTimes: number[][] = urls.map(() => []);
    let polling = true;
    const poller = (async () => {
      const last = [...before];
      while (polling) {
        const now = await fetched().catch(() => last);
        now.forEach((n, i) => {
          for (let k = last[i]; k < n; k++) fetchTimes[i].push(Date.now());
          last[i] = n;
        });
        await delay(100);
      }
    })();

    proxy.blackhole();
    await delay(BLACKHOLE_MS);
    await redis.kill();
    // Connections the blackhole kept open are cut; reconnections reach a dead Redis now.
    proxy.pass();
    proxy.cut();
    // While it is down, readiness stays 200 and says degraded; the metric says so too.
    const ready = await waitFor(
      async () => {
        const res = await httpGet(`${admins[0]}/health/ready`);
        return res.status === 200 && res.body.includes('"status":"degraded"') ? res : undefined;
      },
      { timeoutMs: 3000, what: 'readiness to report the store degraded' },
    );
    expect(JSON.parse(ready.body)).toMatchObject({ details: { store: { status: 'degraded' } } });
    expect(await metricValue(admins[0], 'token_broker_degraded')).toBe(1);
    await delay(Math.max(0, outageStart + BLACKHOLE_MS + DOWN_MS - Date.now()));

    const during = await fetched();
    const outageMs = Date.now() - outageStart;
    polling = false;
    await poller;
    const requestsDuringOutage = fleet.emulator.stats.tokenRequests - requestsBefore;

    await redis.restart();
    const restartedAt = Date.now();
    const raw = new Redis(redis.url, { maxRetriesPerRequest: 1, lazyConnect: true });
    raw.on('error', () => undefined);
    try {
      await raw.connect();
      // Converged: every replica serves one token, and it is the one in L2.
      const converged = await waitFor(
        async () => {
          const tokens = await Promise.all(urls.map((u) => currentToken(u, FLEET_CLIENT)));
          const fp = await raw.hget(redisKeys.token(FLEET_CLIENT), 'fp');
          const one = tokens[0];
          return one !== undefined && tokens.every((t) => t === one) && fp === fingerprintOf(one)
            ? one
            : undefined;
        },
        {
          timeoutMs: LIFETIME_S * 1000 * 2,
          intervalMs: 50,
          what: 'the fleet to converge on one token in L2',
        },
      );
      const convergedMs = Date.now() - restartedAt;
      await waitFor(
        async () =>
          (await Promise.all(admins.map((u) => metricValue(u, 'token_broker_degraded')))).every(
            (v) => v === 0,
          ),
        { timeoutMs: 3000, what: 'every replica to leave degraded mode' },
      );
      // And it stays one token per cycle for the fleet afterwards.
      const afterRecovery = fleet.emulator.stats.tokenRequests;
      await delay(LIFETIME_S * 1000);
      const result = await load.stop();
      const stats = fleet.emulator.stats;
      const recoveryTimes = stats.tokenRequestTimes.slice(afterRecovery);
      const recoveryCycles = requestsPerCycle(recoveryTimes, 500);

      const perReplica = during.map((n, i) => n - before[i]);
      // A replica alone refreshes at its client's point of the spread window (refresh-schedule):
      // never sooner after obtaining a token than this, which is one token's shortest cycle.
      const minCycleMs = shortestRefreshMs(AHEAD_S * 1000, LIFETIME_S * 1000);
      const maxPerReplica = Math.floor(outageMs / minCycleMs) + 1;
      const gaps = fetchTimes.flatMap((times) => times.slice(1).map((t, i) => t - times[i]));
      // The poll adds up to 100 ms of error to each time, and a busy machine a little more.
      const minGapMs = Math.min(...gaps);
      console.log(
        figures('redis-outage', result, {
          baselineMaxLatencyMs: Math.round(baselineMaxMs),
          outageMaxLatencyMs: Math.round(outageMaxMs),
          refusalsWhileValid: watch.refusalsWhileValid().length,
          providerRequests: stats.tokenRequests,
          duringOutage: requestsDuringOutage,
          perReplicaDuringOutage: perReplica.join('/'),
          maxAllowedPerReplica: maxPerReplica,
          minGapBetweenOwnFetchesMs: minGapMs,
          outageMs,
          convergedMsAfterRestart: convergedMs,
          afterRecoveryCycles: recoveryCycles.join(','),
        }),
      );

      expect(result.calls).toBeGreaterThan(1000);
      expect(result.failures).toEqual([]);
      expect(result.validationErrors).toEqual([]);
      expect(watch.refusals).toEqual([]);
      // No request waited on Redis: none took the command timeout on top of what the machine's
      // load already cost before the outage.
      expect(outageMaxMs).toBeLessThan(
        COMMAND_TIMEOUT_MS + Math.max(LATENCY_MARGIN_MS, baselineMaxMs),
      );
      // Every replica refreshed on its own while Redis was away, never more than once a cycle.
      for (const n of perReplica) {
        expect(n).toBeGreaterThanOrEqual(1);
        expect(n).toBeLessThanOrEqual(maxPerReplica);
      }
      expect(minGapMs).toBeGreaterThan(minCycleMs - 300);
      expect(converged).toBeDefined();
      // Back to one provider request per cycle for the whole fleet.
      expect(Math.max(0, ...recoveryCycles)).toBeLessThanOrEqual(1);
    } finally {
      await load.stop();
      raw.disconnect();
    }
  }, 60_000);
});
