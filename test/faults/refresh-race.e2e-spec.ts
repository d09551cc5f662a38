import { Redis } from 'ioredis';
import { redisSettingsSchema } from '../../src/config/redis.schema';
import { redisKeys } from '../../src/redis/redis.constants';
import { createRedisConnection } from '../../src/redis/redis.connection';
import { RedisTokenStore } from '../../src/redis/token-store.redis';
import { PlainTokenCipher } from '../../src/token/token-cipher';
import { fingerprintOf, toRecord } from '../../src/token/token-record';
import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import { type Fleet, FLEET_CLIENT } from '../support/fleet';
import { figures, nextRefresh } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 10;
const AHEAD_S = 4;
/** Holds the first refresher inside the lock for longer than it takes a second to finish. */
const SLOW_ANSWER_MS = 3000;

/**
 * Design: the lock is an efficiency lock; if it is ever granted twice, both refreshers fetch,
 * and the fenced write guarantees that the older token never overwrites the newer one. The
 * double grant is simulated by deleting the lock key while its holder waits for the provider.
 */
describe('two refreshers racing (the lock granted twice)', () => {
  let fleet: Fleet;
  let raw: Redis;
  let sub: Redis;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      env: {
        TOKEN_LOCK_TTL_MS: '2000',
        PROVIDER_RESPONSE_TIMEOUT_MS: '10000',
      },
    });
    raw = new Redis(fleet.redis.url, { maxRetriesPerRequest: 1 });
    sub = new Redis(fleet.redis.url);
  }, 30_000);

  afterAll(async () => {
    raw?.disconnect();
    sub?.disconnect();
    await fleet?.stop();
  }, 30_000);

  it('never moves the stored token back to an older expiry', async () => {
    const { emulator } = fleet;
    const tokenKey = redisKeys.token(FLEET_CLIENT);

    // Every successful fenced write publishes its expiry; every poll reads the stored one.
    const published: number[] = [];
    sub.on('message', (_channel: string, message: string) => {
      if (message.startsWith('u:')) published.push(Number(message.slice(2)));
    });
    await sub.subscribe(redisKeys.events(FLEET_CLIENT));
    const polled: number[] = [];
    const storedFps = new Set<string>();
    let polling = true;
    const poller = (async () => {
      while (polling) {
        const [exp, fp] = await raw.hmget(tokenKey, 'exp', 'fp');
        if (exp !== null) polled.push(Number(exp));
        if (fp !== null) storedFps.add(fp);
        await delay(5);
      }
    })();

    const load = startTokenLoad(fleet);
    const { watch } = load;
    try {
      const current = await nextRefresh(emulator, LIFETIME_S * 1000);
      emulator.setKnobs({ tokenLatencyMs: SLOW_ANSWER_MS });
      const requestsBefore = emulator.stats.tokenRequests;
      await waitFor(() => emulator.stats.tokenRequests > requestsBefore, {
        timeoutMs: LIFETIME_S * 1000,
        intervalMs: 5,
        what: 'the first refresher to reach the provider',
      });
      // First refresher is inside the lock, waiting. Grant the lock a second time.
      emulator.setKnobs({ tokenLatencyMs: 0 });
      expect(await raw.del(redisKeys.lock(FLEET_CLIENT))).toBe(1);
      const raceStart = Date.now();

      const second = await waitFor(
        () => emulator.stats.issued.find((g) => g.issuedAt > raceStart),
        {
          timeoutMs: SLOW_ANSWER_MS - 200,
          intervalMs: 5,
          what: 'a second refresher to fetch while the first one waits',
        },
      );
      const first = await waitFor(
        () =>
          emulator.stats.issued.find(
            (g) => g.issuedAt > second.issuedAt && g.token !== second.token,
          ),
        {
          timeoutMs: SLOW_ANSWER_MS + 1000,
          intervalMs: 5,
          what: 'the first refresher to get its (older) token',
        },
      );
      // Give the first refresher time to attempt its fenced write (well before the next cycle).
      await delay(300);
      const storedAfterRace = await raw.hmget(tokenKey, 'exp', 'fp');

      // The same guarantee, asserted directly on the store's fenced write.
      const settings = redisSettingsSchema.parse({ url: fleet.redis.url });
      const store = new RedisTokenStore(
        createRedisConnection(settings, 'command'),
        createRedisConnection(settings, 'subscriber'),
        new PlainTokenCipher(),
        settings,
        2000,
        [FLEET_CLIENT],
      );
      let olderWritten: boolean;
      let sameWritten: boolean;
      try {
        await store.health.waitUntilReady(2000);
        const storedExp = Number(storedAfterRace[0]);
        const older = toRecord({
          accessToken: 'an-older-token',
          // Seconds older, not one: a write's own transit time counts towards its expiry, and
          // on a machine starved enough (load average 12 on 2 cores) it passed a second.
          obtainedAt: storedExp - LIFETIME_S * 1000 - 5000,
          expiresAt: storedExp - 5000,
        });
        olderWritten = await store.records.writeFenced(FLEET_CLIENT, older);
        // The stored token itself, written again as if it expired a second later (what a
        // millisecond of clock conversion could make it look like): refused by fingerprint. A
        // different token with the very same expiry cannot be produced through a duration-based
        // write on the millisecond, so it is not asked for here.
        sameWritten = await store.records.writeFenced(FLEET_CLIENT, {
          ...older,
          expiresAt: storedExp + 1000,
          fingerprint: String(storedAfterRace[1]),
        });
      } finally {
        await store.health.close();
      }
      await delay(Math.max(0, current.expiresAt - Date.now()));
      const result = await load.stop();
      polling = false;
      await poller;

      const backwardsPolled = polled.filter((e, i) => i > 0 && e < polled[i - 1]).length;
      const backwardsPublished = published.filter((e, i) => i > 0 && e <= published[i - 1]).length;
      console.log(
        figures('refresh-race', result, {
          refusals: watch.refusals.length,
          providerRequests: emulator.stats.tokenRequests,
          raceFetches: emulator.stats.issued.filter(
            (g) => g.issuedAt >= second.issuedAt && g.issuedAt <= first.issuedAt,
          ).length,
          secondMsBeforeFirst: first.issuedAt - second.issuedAt,
          storedExpiryReads: polled.length,
          backwardsReads: backwardsPolled,
          publishedWrites: published.length,
          backwardsWrites: backwardsPublished,
          directOlderWriteAccepted: String(olderWritten),
          directRewriteOfStoredAccepted: String(sameWritten),
        }),
      );

      expect(result.calls).toBeGreaterThan(1000);
      expect(result.failures).toEqual([]);
      expect(result.validationErrors).toEqual([]);
      expect(watch.refusals).toEqual([]);
      expect(backwardsPolled).toBe(0);
      expect(backwardsPublished).toBe(0);
      // The second (newer) token won; the first refresher's older one never reached L2.
      expect(storedAfterRace[1]).toBe(fingerprintOf(second.token));
      expect(storedFps.has(fingerprintOf(first.token))).toBe(false);
      expect(olderWritten).toBe(false);
      expect(sameWritten).toBe(false);
      expect(await raw.hget(tokenKey, 'fp')).not.toBe(fingerprintOf('an-older-token'));
    } finally {
      polling = false;
      await load.stop();
      await poller;
      emulator.setKnobs({ tokenLatencyMs: 0 });
    }
  }, 60_000);
});
