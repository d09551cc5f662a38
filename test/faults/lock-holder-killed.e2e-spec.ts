import { startFaultFleet, startTokenLoad } from '../support/fault-fleet';
import type { Fleet } from '../support/fleet';
import { figures, metricValue, nextRefresh } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

const LIFETIME_S = 8;
const AHEAD_S = 4;
const LOCK_TTL_MS = 800;

/**
 * Design, "one refresher per fleet": the lock is a lease. A holder that dies after taking
 * it and before writing the new token must not leave the fleet without one: the lease runs out
 * and another replica refreshes before the old token expires.
 */
describe('lock holder SIGKILLed between taking the lock and writing the token', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = await startFaultFleet({
      lifetimeS: LIFETIME_S,
      aheadS: AHEAD_S,
      env: {
        TOKEN_LOCK_TTL_MS: String(LOCK_TTL_MS),
        TOKEN_WAIT_TIMEOUT_MS: '2000',
        TOKEN_BACKOFF_BASE_MS: '100',
        TOKEN_BACKOFF_MAX_MS: '1000',
        PROVIDER_RESPONSE_TIMEOUT_MS: '10000',
      },
    });
  }, 30_000);

  afterAll(async () => {
    await fleet?.stop();
  }, 30_000);

  it('another replica refreshes before the old token expires', async () => {
    const { emulator, brokers } = fleet;
    const load = startTokenLoad(fleet);
    const { urls, watch } = load;
    const acquired = () =>
      Promise.all(
        urls.map((u) => metricValue(u, 'token_broker_lock_attempts_total', { result: 'acquired' })),
      );

    try {
      // Right after a refresh, hold the provider's next answer for longer than the lock TTL
      // and the remaining refresh window: whoever takes the lock next is stuck inside it.
      const current = await nextRefresh(emulator, LIFETIME_S * 1000);
      emulator.setKnobs({ tokenLatencyMs: LIFETIME_S * 1000 });
      const locksBefore = await acquired();
      const requestsBefore = emulator.stats.tokenRequests;

      // The holder is the replica whose lock count went up while a token request is in flight.
      await waitFor(() => emulator.stats.tokenRequests > requestsBefore, {
        timeoutMs: LIFETIME_S * 1000,
        intervalMs: 5,
        what: 'the next refresh to reach the provider',
      });
      const locksNow = await acquired();
      const holders = locksNow
        .map((n, i) => n - locksBefore[i])
        .flatMap((d, i) => (d > 0 ? [i] : []));
      expect(holders).toHaveLength(1);
      const victim = brokers[holders[0]];
      emulator.setKnobs({ tokenLatencyMs: 0 });
      const killedAt = Date.now();
      const exit = await victim.kill('SIGKILL');
      expect(exit.signal).toBe('SIGKILL');

      const takeover = await waitFor(
        () => emulator.stats.issued.find((g) => g.issuedAt > killedAt),
        {
          timeoutMs: current.expiresAt - Date.now(),
          intervalMs: 10,
          what: 'another replica to refresh',
        },
      );
      const survivors = urls.filter((u) => u !== victim.url);
      await waitFor(
        () => survivors.every((u) => watch.lastServedBy.get(u)?.token === takeover.token),
        { timeoutMs: 3000, what: 'every survivor to serve the new token' },
      );
      await delay(Math.max(0, current.expiresAt + 500 - Date.now()));
      const result = await load.stop();

      // Requests to the killed replica fail (it is gone); everything else must not.
      const survivorFailures = result.failures.filter((f) => f.url !== victim.url);
      const refusals = watch.refusals.filter((r) => r.url !== victim.url);
      console.log(
        figures('lock-holder-killed', result, {
          failuresOnKilledReplica: result.failureCount - survivorFailures.length,
          survivorFailures: survivorFailures.length,
          survivorRefusals: refusals.length,
          providerRequests: emulator.stats.tokenRequests,
          takeoverMsAfterKill: takeover.issuedAt - killedAt,
          takeoverMsBeforeOldExpiry: current.expiresAt - takeover.issuedAt,
        }),
      );

      expect(result.calls).toBeGreaterThan(1000);
      expect(survivorFailures).toEqual([]);
      expect(refusals).toEqual([]);
      expect(result.validationErrors).toEqual([]);
      // The survivors had the new token with more than the minimum serving time to spare.
      expect(takeover.issuedAt).toBeLessThan(current.expiresAt - 1000);
      // The lease ran out, no sooner: the lock was not stolen from a live holder.
      expect(takeover.issuedAt - killedAt).toBeGreaterThan(LOCK_TTL_MS / 3);
    } finally {
      await load.stop();
      emulator.setKnobs({ tokenLatencyMs: 0 });
    }
  }, 60_000);
});
