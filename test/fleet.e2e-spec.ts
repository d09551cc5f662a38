/**
 * @alone: it times brokers under load; no other suite runs beside it (scripts/test.mjs).
 */
import { hammer } from './support/load';
import { watchObserverLag } from './support/observer-lag';
import { FLEET_CLIENT, requestsPerCycle } from './support/fleet';
import { type RedisTopology, startTopology, TOPOLOGY_KINDS } from './support/redis/topology';
import { type Stack, startStack } from './support/stack';

/**
 * The product's promise: a whole fleet makes one provider token request per token lifetime,
 * under load, and never serves an expired token.
 */
describe.each(TOPOLOGY_KINDS)('fleet of 5 brokers sharing one Redis (%s)', (kind) => {
  const LIFETIME_S = 3;
  const AHEAD_S = 1;
  const LIFETIMES = 6;
  let topology: RedisTopology;
  let fleet: Stack;

  // Processes: five replicas of a fleet.
  beforeAll(async () => {
    topology = await startTopology(kind);
    fleet = await startStack({
      name: `fleet-${kind}`,
      clients: [FLEET_CLIENT],
      redis: topology,
      replicas: 5,
      knobs: { tokenLifetimeSeconds: LIFETIME_S },
      env: {
        LOG_LEVEL: 'warn',
        TOKEN_REFRESH_AHEAD_SECONDS: String(AHEAD_S),
        TOKEN_DEFAULT_LIFETIME_SECONDS: String(LIFETIME_S),
      },
    });
  });

  afterAll(async () => {
    await fleet?.close();
    await topology?.stop();
  });

  it(`makes one provider token request per refresh cycle over ${LIFETIMES} lifetimes, with no caller error and no expired token`, async () => {
    const issued = () => fleet.provider.stats.issued;
    const startRequests = fleet.provider.stats.tokenRequests;
    // Each token's expiry as the brokers stated it: the fetching replica's send time plus the
    // lifetime, on its own clock. The emulator's request times are taken in this (busy) test
    // process and can lag by hundreds of milliseconds under CI load, so they group requests
    // into cycles but do not time the refresh schedule. The earliest stated expiry is the
    // writer's: a reader states the same, or a later one when the write reached Redis too late
    // for the writer's figure to be believed (`localExpiry`).
    const servedExpiries = new Map<string, number>();
    const lag = watchObserverLag();
    const result = await hammer({
      urls: fleet.brokers.map((b) => b.url),
      path: `/token?client=${FLEET_CLIENT}`,
      concurrency: 25,
      durationMs: LIFETIME_S * LIFETIMES * 1000,
      validate: (res) => {
        if (res.status !== 200) return `status ${res.status}`;
        const body = JSON.parse(res.body) as {
          access_token: string;
          expires_at: string;
          expires_in: number;
        };
        const expiresAt = Date.parse(body.expires_at);
        if (expiresAt <= res.receivedAt) return `expired token served by ${res.url}`;
        const known = servedExpiries.get(body.access_token);
        if (known === undefined || expiresAt < known)
          servedExpiries.set(body.access_token, expiresAt);
        const grant = issued().find((g) => g.token === body.access_token);
        if (!grant) return 'a token the provider never issued';
        if (grant.expiresAt <= res.receivedAt)
          return `token past the provider's expiry served by ${res.url}`;
        if (body.expires_in > LIFETIME_S)
          return `expires_in ${body.expires_in} exceeds the lifetime`;
        return null;
      },
    });

    const observerLagMs = Math.round(lag.stop());
    const stats = fleet.provider.stats;
    const times = stats.tokenRequestTimes;
    const gaps = times.slice(1).map((t, i) => t - times[i]);
    const expiries = [...servedExpiries.values()].sort((a, b) => a - b);
    const scheduleGaps = expiries.slice(1).map((t, i) => t - expiries[i]);
    // Each cycle refreshes between two leads and one before expiry: two requests closer than
    // half a cycle belong to the same cycle, i.e. a second replica fetched too.
    const minCycleMs = (LIFETIME_S - AHEAD_S - 0.25) * 1000;
    const cycles = requestsPerCycle(times, minCycleMs * 0.5);
    console.log(
      `fleet (${kind}): ${result.calls} calls, ${result.failures.length} failures, ${result.validationErrors.length} invalid; ` +
        `${stats.tokenRequests - startRequests} token requests in ${cycles.length} cycles (max ${Math.max(...cycles)} per cycle), ` +
        `min gap ${Math.min(...gaps)} ms at the provider (this process stalled up to ${observerLagMs} ms), ${Math.min(...scheduleGaps)} ms between the brokers' sends`,
    );

    if (Math.max(...cycles) > 1) {
      // Say why a cycle saw two fetches: the replicas' warnings name the store or lock trouble.
      for (const b of fleet.brokers) {
        const trouble = b
          .logs()
          .filter((l) => /"level":"(warn|error)"/.test(l) && !/IS OFF/.test(l));
        if (trouble.length > 0) console.log(`${b.name}:\n${trouble.join('\n')}`);
      }
    }
    expect(result.calls).toBeGreaterThan(1000);
    expect(result.failures).toEqual([]);
    expect(result.validationErrors).toEqual([]);
    expect(cycles.length).toBeGreaterThanOrEqual(LIFETIMES);
    expect(Math.max(...cycles)).toBe(1);
    // No replica refreshed early: a client refreshes at its phase of a window one lead wide
    // before expiry - lead (refresh-schedule.ts), so consecutive tokens are at least the lifetime
    // less two leads apart.
    expect(expiries.length).toBeGreaterThanOrEqual(LIFETIMES);
    expect(Math.min(...scheduleGaps)).toBeGreaterThan((LIFETIME_S - 2 * AHEAD_S) * 1000 * 0.9);
    // Every replica served callers the whole time.
    expect(Object.keys(result.byStatus)).toEqual(['200']);
  }, 90_000);
});
