/**
 * @timed: it times brokers under load; only another @timed suite runs beside it (scripts/test.mjs).
 */
import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import type { Fleet } from '../support/fleet';
import { figures, metricValue, nextRefresh } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 6;
const AHEAD_S = 3;
const BACKOFF_BASE_MS = 100;
const BACKOFF_MAX_MS = 1000;
/** Full jitter has no hard floor above 25 ms; this is far above what it does in practice. */
const MAX_ATTEMPTS_PER_REPLICA = 30;

/**
 * Design, "provider down": keep serving the current token until it expires, retry with
 * capped exponential backoff and full jitter (the cap shrinking as expiry nears), and answer
 * 503 with Retry-After once no valid token is left.
 */
describe('provider token endpoint failing through the refresh window', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      env: {
        TOKEN_BACKOFF_BASE_MS: String(BACKOFF_BASE_MS),
        TOKEN_BACKOFF_MAX_MS: String(BACKOFF_MAX_MS),
        TOKEN_WAIT_TIMEOUT_MS: '1000',
        PROVIDER_RESPONSE_TIMEOUT_MS: '400',
        TOKEN_LOCK_TTL_MS: '1000',
      },
    });
  }, 30_000);

  afterAll(async () => {
    await fleet?.stop();
  }, 30_000);

  it('serves the current token through 503s, timeouts and garbage, recovers before expiry, and answers 503 + Retry-After after it', async () => {
    const { emulator } = fleet;
    const load = startTokenLoad(fleet);
    const { urls, watch } = load;
    const transientErrors = () =>
      Promise.all(
        urls.map((u) =>
          metricValue(u, 'token_broker_refresh_total', { result: 'transient_error' }),
        ),
      );

    try {
      // Start right after a refresh, so the whole refresh window lies ahead.
      const fresh = await nextRefresh(emulator, LIFETIME_S * 1000);
      const expiresAt = fresh.expiresAt;
      const windowStart = expiresAt - AHEAD_S * 1000 - (AHEAD_S * 1000) / 4;
      const recoverAt = expiresAt - 1500;
      await delay(Math.max(0, windowStart - 300 - Date.now()));

      // Phase 1: failing from before the refresh window to 1.5 s before expiry.
      const errorsBefore = await transientErrors();
      const requestsBefore = emulator.stats.tokenRequests;
      const failStart = Date.now();
      const third = (recoverAt - failStart) / 3;
      emulator.setKnobs({ tokenFailure: { kind: 'status', status: 503 } });
      await delay(third);
      emulator.setKnobs({ tokenFailure: { kind: 'timeout' } });
      await delay(third);
      emulator.setKnobs({
        tokenFailure: {
          kind: 'garbage',
          contentType: 'text/html',
          body: '<html><body><h1>502 Bad Gateway</h1></body></html>',
        },
      });
      await delay(Math.max(0, recoverAt - Date.now()));
      const attemptsWhileFailing = emulator.stats.tokenRequests - requestsBefore;
      const perReplica = (await transientErrors()).map((n, i) => n - errorsBefore[i]);
      emulator.setKnobs({ tokenFailure: null });
      const recovered = await waitFor(
        () => emulator.stats.issued.find((g) => g.issuedAt >= recoverAt - 50),
        { timeoutMs: 1500, what: 'a new token after the provider recovered' },
      );
      await waitFor(() => watch.served.has(recovered.token), {
        timeoutMs: 1500,
        what: 'callers to get the new token',
      });
      const recoveredBeforeExpiryMs = expiresAt - recovered.issuedAt;

      // Phase 2: the provider goes down again and stays down past the new token's expiry.
      emulator.setKnobs({ tokenFailure: { kind: 'status', status: 503 } });
      const secondExpiry = recovered.expiresAt;
      // The gauge the near-expiry alert reads falls through the outage, to 0 after expiry.
      const remaining = () => metricValue(urls[0], 'token_broker_token_remaining_seconds');
      // The first reading once the replica behind urls[0] holds the recovered token too: the
      // callers may have met it on another replica first, and the old token's last second is
      // not the fall this measures.
      const gauge = [
        await waitFor(
          async () => {
            const v = await remaining();
            return v > (secondExpiry - Date.now()) / 1000 - 1 ? v : undefined;
          },
          { timeoutMs: 1500, what: `${urls[0]} to hold the recovered token` },
        ),
      ];
      await delay(Math.max(0, secondExpiry - 1500 - Date.now()));
      gauge.push(await remaining());
      await delay(Math.max(0, secondExpiry + 2500 - Date.now()));
      gauge.push(await remaining());
      const refusedAfterExpiry = watch.refusals.filter((r) => r.sentAt >= secondExpiry - 1000);
      emulator.setKnobs({ tokenFailure: null });
      const recoveryRequestedAt = Date.now();
      await waitFor(
        () => [...watch.lastServedBy.values()].some((s) => s.at > recoveryRequestedAt),
        { timeoutMs: 4000, what: 'callers to be served again after the provider came back' },
      );
      const result = await load.stop();

      console.log(
        figures('provider-outage', result, {
          refusalsWhileValid: watch.refusalsWhileValid().length,
          providerRequests: emulator.stats.tokenRequests,
          attemptsWhileFailing,
          perReplicaFailedAttempts: perReplica.join('/'),
          failingMs: recoverAt - failStart,
          newTokenMsBeforeOldExpiry: recoveredBeforeExpiryMs,
          refusedAfterExpiry: refusedAfterExpiry.length,
          remainingGauge: gauge.map((g) => g.toFixed(1)).join(' -> '),
        }),
      );
      expect(gauge[1]).toBeLessThan(gauge[0] - 1);
      expect(gauge[1]).toBeGreaterThan(0);
      expect(gauge[2]).toBe(0);

      expect(result.calls).toBeGreaterThan(1000);
      expect(result.failures).toEqual([]);
      expect(result.validationErrors).toEqual([]);
      expect(watch.refusalsWhileValid()).toEqual([]);
      // Retries happened and stayed bounded, on every replica that tried.
      expect(attemptsWhileFailing).toBeGreaterThanOrEqual(2);
      for (const n of perReplica) expect(n).toBeLessThanOrEqual(MAX_ATTEMPTS_PER_REPLICA);
      expect(attemptsWhileFailing).toBeLessThanOrEqual(urls.length * MAX_ATTEMPTS_PER_REPLICA);
      // The new token came before the old one expired (callers never saw the gap).
      expect(recoveredBeforeExpiryMs).toBeGreaterThan(0);
      // After expiry with the provider down: 503, problem+json, Retry-After, a stable code.
      expect(refusedAfterExpiry.length).toBeGreaterThan(0);
      for (const r of watch.refusals) {
        expect(r).toMatchObject({
          status: 503,
          code: 'token_unavailable',
          contentType: expect.stringMatching(/^application\/problem\+json/) as unknown,
          retryAfter: expect.stringMatching(/^[1-9]\d*$/) as unknown,
        });
        expect(r.detail).toMatch(/HTTP 503/);
      }
    } finally {
      await load.stop();
      emulator.setKnobs({ tokenFailure: null });
    }
  }, 60_000);
});
