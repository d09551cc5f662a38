/**
 * @timed: it times brokers under load; only another @timed suite runs beside it (scripts/test.mjs).
 */
import { startFaultFleet } from './support/fault-fleet';
import { type Fleet, FLEET_CLIENT } from './support/fleet';
import { hammer } from './support/load';
import { watchObserverLag } from './support/observer-lag';
import { maxOf, minOf } from './support/stats';

const LIFETIME_S = 4;
const AHEAD_S = 2;
const RETRY_AFTER_S = 3;
const WAIT_TIMEOUT_MS = 1000;
/** How long after the token's expiry the provider keeps answering 429. */
const AFTER_EXPIRY_MS = 13_000;
/** Timer and scheduling slack on a loaded 2-core machine. */
const SLACK_MS = 150;

interface Refused {
  sentAt: number;
  receivedAt: number;
  latencyMs: number;
  retryAfterS: number;
}

/**
 * The provider answers 429 with `Retry-After` to a fleet of three: the fleet shares the
 * deferral through Redis, so it makes one attempt per window, not one per replica. After expiry,
 * callers are refused at once (not held for the whole wait) with the real time of the next
 * attempt in `Retry-After`.
 */
describe('fleet of 3 brokers and a provider answering 429 with Retry-After', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      env: {
        TOKEN_WAIT_TIMEOUT_MS: String(WAIT_TIMEOUT_MS),
        TOKEN_BACKOFF_BASE_MS: '200',
        TOKEN_BACKOFF_MAX_MS: '10000',
      },
    });
  });

  afterAll(async () => {
    await fleet?.stop();
  });

  it('makes one provider attempt per Retry-After window, across the expiry too, and refuses callers at once with the real next attempt', async () => {
    const emulator = fleet.emulator;
    const current = emulator.stats.issued.at(-1)!;
    const expiry = current.expiresAt;
    const from = Date.now();
    emulator.setKnobs({
      tokenFailure: { kind: 'status', status: 429, retryAfter: String(RETRY_AFTER_S) },
    });
    const refused: Refused[] = [];
    let served = 0;
    const lag = watchObserverLag();
    const load = await hammer({
      urls: fleet.brokers.map((b) => b.url),
      path: `/token?client=${FLEET_CLIENT}`,
      concurrency: 6,
      until: () => Date.now() > expiry + AFTER_EXPIRY_MS,
      durationMs: 60_000,
      isSuccess: () => true,
      validate: (res) => {
        if (res.status === 200) {
          served++;
          return null;
        }
        if (res.status !== 503) return `status ${res.status}`;
        const retryAfter = Number(res.headers['retry-after']);
        if (!Number.isInteger(retryAfter) || retryAfter < 1) return 'a 503 without Retry-After';
        refused.push({
          sentAt: res.receivedAt - res.latencyMs,
          receivedAt: res.receivedAt,
          latencyMs: res.latencyMs,
          retryAfterS: retryAfter,
        });
        return null;
      },
    });
    emulator.setKnobs({ tokenFailure: null });
    const observerLagMs = Math.round(lag.stop());

    const attempts = emulator.stats.tokenRequestTimes.filter((t) => t >= from);
    const afterExpiry = attempts.filter((t) => t > expiry);
    // Every attempt since the 429s began, across the expiry: the last ones before it (when a
    // replica is tempted by a "last chance") and the first after it too.
    const gaps = attempts.slice(1).map((t, i) => t - attempts[i]);
    const instant = refused.filter((r) => r.latencyMs < 100).length;
    // Where each 503's Retry-After points, against the fleet's real attempts. A caller that
    // retries then finds an attempt made since it asked (`early`: by how much it was not), and
    // was not told to wait much longer than the next attempt (`late`). An attempt during the
    // request counts for the first: the answer may have been decided just before it.
    const misses = refused
      .filter((r) => r.sentAt > expiry)
      .map((r) => ({
        r,
        afterSend: attempts.find((t) => t >= r.sentAt),
        afterReceipt: attempts.find((t) => t >= r.receivedAt),
      }))
      .filter(
        ({ afterSend, afterReceipt }) => afterSend !== undefined && afterReceipt !== undefined,
      )
      .map(({ r, afterSend, afterReceipt }) => ({
        early: afterSend! - (r.receivedAt + r.retryAfterS * 1000),
        late: r.sentAt + (r.retryAfterS - 1) * 1000 - afterReceipt!,
      }));
    const worstEarly = maxOf(misses.map((m) => m.early));
    const worstLate = maxOf(misses.map((m) => m.late));
    const max503LatencyMs = maxOf(refused.map((r) => r.latencyMs));
    console.log(
      `[fleet-429] replicas=3 retryAfterS=${RETRY_AFTER_S} calls=${load.calls} served=${served} refused503=${refused.length} ` +
        `providerAttempts=${attempts.length} (beforeExpiry=${attempts.length - afterExpiry.length}, ` +
        `afterExpiry=${afterExpiry.length} in ${AFTER_EXPIRY_MS} ms = ${(afterExpiry.length / (AFTER_EXPIRY_MS / (RETRY_AFTER_S * 1000))).toFixed(2)} per window) ` +
        `minGapMs=${gaps.length ? minOf(gaps) : 'n/a'} ` +
        `refusedUnder100ms=${instant}/${refused.length} max503LatencyMs=${Math.round(max503LatencyMs)} ` +
        `retryAfterWorstEarlyMs=${worstEarly} retryAfterWorstLateMs=${Math.round(worstLate)} observerLagMs=${observerLagMs}`,
    );

    expect(load.validationErrors).toEqual([]);
    expect(afterExpiry.length).toBeGreaterThanOrEqual(2);
    // One attempt per window for the whole fleet (three replicas honouring it alone would
    // make about three), before, at and after the expiry. The emulator stamps the attempts in
    // this process: late by its stalls.
    expect(attempts.length).toBeGreaterThan(afterExpiry.length);
    for (const gap of gaps)
      expect(gap).toBeGreaterThanOrEqual(RETRY_AFTER_S * 1000 - SLACK_MS - observerLagMs);
    expect(afterExpiry.length).toBeLessThanOrEqual(
      Math.ceil(AFTER_EXPIRY_MS / (RETRY_AFTER_S * 1000)) + 1,
    );
    // Nobody is held past the wait timeout, and most 503s come at once.
    expect(max503LatencyMs).toBeLessThan(WAIT_TIMEOUT_MS + 500);
    expect(instant).toBeGreaterThan(refused.length / 2);
    // Retry-After is the real next attempt: retrying then finds it made (not long before).
    expect(worstEarly).toBeLessThanOrEqual(SLACK_MS * 2);
    expect(worstLate).toBeLessThanOrEqual(SLACK_MS * 2);
  }, 60_000);
});
