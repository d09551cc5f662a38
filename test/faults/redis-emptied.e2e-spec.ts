import { Redis } from 'ioredis';
import { redisKeys } from '../../src/redis/redis.constants';
import { shortestRefreshMs } from '../../src/token/refresh-schedule';
import { fingerprintOf } from '../../src/token/token-record';
import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import { type Fleet, FLEET_CLIENT, requestsPerCycle } from '../support/fleet';
import { startRedis, type TestRedis } from '../support/redis/standalone';
import { figures, nextRefresh, type TokenWatch } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 6;
const AHEAD_S = 2;
/**
 * Every replica's timer for a cycle fires at the client's point of the spread window
 * (refresh-schedule), give or take their clocks and timers: once this long has passed after a
 * cycle's refresh, every replica has adopted it and none is due until the next cycle.
 */
const ADOPTED_AFTER_MS = 800;

/**
 * Redis loses its data under load (FLUSHALL by an operator, or a restart without
 * persistence). The replicas still hold the token in memory; the shared copy must come back
 * with one provider request for the fleet, not one per replica.
 */
describe('Redis flushed, or restarted empty, under load', () => {
  let redis: TestRedis;
  let fleet: Fleet;
  let raw: Redis;

  beforeAll(async () => {
    redis = await startRedis({ forceLocal: true });
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      redis,
      env: {
        REDIS_COMMAND_TIMEOUT_MS: '300',
        REDIS_PING_INTERVAL_MS: '200',
        TOKEN_LOCK_TTL_MS: '1000',
      },
    });
    raw = new Redis(redis.url, { maxRetriesPerRequest: 1 });
    raw.on('error', () => undefined);
  }, 30_000);

  afterAll(async () => {
    raw?.disconnect();
    await fleet?.stop();
    await redis?.stop();
  }, 30_000);

  /** The fingerprint in L2 once it matches the token every replica serves. */
  async function storedAndServed(watch: TokenWatch, urls: string[], after: number) {
    return waitFor(
      async () => {
        const fp = await raw.hget(redisKeys.token(FLEET_CLIENT), 'fp');
        const served = urls.map((u) => watch.lastServedBy.get(u));
        const token = served[0]?.token;
        return token !== undefined &&
          fp === fingerprintOf(token) &&
          served.every((s) => s !== undefined && s.token === token && s.at > after)
          ? token
          : undefined;
      },
      {
        timeoutMs: LIFETIME_S * 1000,
        intervalMs: 20,
        what: 'L2 to hold the token the fleet serves',
      },
    );
  }

  it('repopulates L2 with one provider request per refresh cycle, after a flush and after a restart', async () => {
    const { emulator } = fleet;
    const load = startTokenLoad(fleet);
    const { urls, watch } = load;
    /** Resolves with the newest issued token right after the next refresh. */
    const refreshed = () => nextRefresh(emulator, LIFETIME_S * 1000, 10);
    try {
      // Flush between two refreshes: L2 is empty until the next one, which must be single.
      await refreshed();
      await delay(ADOPTED_AFTER_MS);
      const flushRequests = emulator.stats.tokenRequests;
      const flushedAt = Date.now();
      await redis.flush();
      const afterFlush = await refreshed();
      const tokenAfterFlush = await storedAndServed(watch, urls, afterFlush.issuedAt);
      const requestsAfterFlush = emulator.stats.tokenRequests - flushRequests;

      // Restart empty between two refreshes (past this cycle's refresh, so no replica is
      // due while Redis is away): the replicas push their token back, with no provider request.
      await refreshed();
      await delay(ADOPTED_AFTER_MS);
      const restartRequests = emulator.stats.tokenRequests;
      const restartedAt = Date.now();
      await redis.restart();
      const resynced = await storedAndServed(watch, urls, restartedAt);
      const resyncedMs = Date.now() - restartedAt;
      const requestsForResync = emulator.stats.tokenRequests - restartRequests;
      const afterRestart = await refreshed();
      await storedAndServed(watch, urls, afterRestart.issuedAt);
      const result = await load.stop();

      const times = emulator.stats.tokenRequestTimes.filter((t) => t >= flushedAt - 100);
      // Requests closer than a little under the shortest cycle are one cycle's.
      const cycles = requestsPerCycle(
        times,
        shortestRefreshMs(AHEAD_S * 1000, LIFETIME_S * 1000) - 250,
      );
      console.log(
        figures('redis-emptied', result, {
          refusals: watch.refusals.length,
          providerRequests: emulator.stats.tokenRequests,
          requestsToRepopulateAfterFlush: requestsAfterFlush,
          requestsToRepopulateAfterRestart: requestsForResync,
          resyncedMsAfterRestart: resyncedMs,
          requestsPerCycle: cycles.join(','),
        }),
      );

      expect(result.calls).toBeGreaterThan(1000);
      expect(result.failures).toEqual([]);
      expect(result.validationErrors).toEqual([]);
      expect(watch.refusals).toEqual([]);
      expect(tokenAfterFlush).toBe(afterFlush.token);
      expect(requestsAfterFlush).toBe(1);
      // After the restart the replicas' own token was written back: no provider request at all.
      expect(requestsForResync).toBe(0);
      expect(resynced).toBeDefined();
      expect(Math.max(...cycles)).toBe(1);
    } finally {
      await load.stop();
    }
  }, 60_000);
});
