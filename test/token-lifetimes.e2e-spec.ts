/**
 * @timed: it times brokers under load; only another @timed suite runs beside it (scripts/test.mjs).
 */
import Redis from 'ioredis';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import type { BrokerProcess } from './support/broker-process';
import { FLEET_CLIENT, FLEET_CREDENTIALS } from './support/fleet';
import { hammer, type HammerResponse } from './support/load';
import { type Stack, startStack } from './support/stack';
import { MIN_SERVE_MS, type TokenBody } from './support/token-watch';
import { waitFor } from './support/wait';

/** The default `TOKEN_MIN_REFRESH_INTERVAL_MS`: these scenarios run with it. */
const FLOOR_MS = 5000;
/** How long each load runs. */
const WINDOW_MS = 8000;
const REPLICAS = 2;

/** What one load saw. */
interface Seen {
  calls: number;
  ok: number;
  /** 200s with less than the minimum left when served (`expires_in` 0, or on receipt). */
  servedShort: number;
  /** Refusals of callers that sent no min_ttl but were told about "the requested min_ttl". */
  untruthful: number;
  /** Refusals without a `Retry-After`. */
  noRetryAfter: number;
  codes: Record<string, number>;
  details: string[];
  /** Token requests the provider received during the load, per second. */
  requestsPerSecond: number;
  requests: number;
}

/**
 * Issue 13 items 1 and 2 with real broker processes sharing one Redis: a provider whose tokens
 * live 0, 1, 2 or 10^9 seconds, and callers whose `min_ttl` is just under the lifetime. The
 * provider's request rate must stay bounded by the fleet's refresh floor, nothing is served
 * with less than the minimum left, and readiness says why.
 */
describe('token lifetimes and min_ttl against the refresh floor', () => {
  /** The provider, the Redis and the config of every scenario; each starts its own fleet. */
  let stack: Stack;
  let raw: Redis;
  let emulator: ProviderEmulator;
  let brokers: BrokerProcess[] = [];
  const figures: string[] = [];

  beforeAll(async () => {
    stack = await startStack({
      name: 'lifetimes',
      clients: [{ id: FLEET_CLIENT, credentials: FLEET_CREDENTIALS }],
      redis: 'standalone',
      replicas: 0,
      admin: true,
      env: { LOG_LEVEL: 'warn' },
    });
    raw = new Redis(stack.redis!.url!, { maxRetriesPerRequest: 1 });
    emulator = stack.provider;
  }, 30_000);

  afterEach(async () => {
    await Promise.all(brokers.splice(0).map((b) => b.stop()));
    await raw.flushall();
  }, 30_000);

  afterAll(async () => {
    // One line for the report: provider token requests per second in each scenario.
    console.log(`[lifetimes] ${figures.join('; ')}`);
    raw?.disconnect();
    await stack?.close();
  }, 30_000);

  /** Starts the fleet with the default floor; waits until it is live (not ready: see each test). */
  async function startBrokers(): Promise<BrokerProcess[]> {
    // Processes: a fleet under load. The stack's test settings are dropped: the scenarios run
    // with the default floor and audit interval.
    const env = { TOKEN_MIN_REFRESH_INTERVAL_MS: undefined, AUDIT_INTERVAL_SECONDS: undefined };
    const started = await Promise.all(
      Array.from({ length: REPLICAS }, (_, i) =>
        stack.addBroker({ env, name: `lifetimes-${i}`, wait: 'listening' }),
      ),
    );
    brokers = started.map((b) => b.process!);
    return brokers;
  }

  /** Callers on every replica for {@link WINDOW_MS}, counting what they got. */
  async function load(query: string, concurrency = 8): Promise<Seen> {
    const seen: Seen = {
      calls: 0,
      ok: 0,
      servedShort: 0,
      untruthful: 0,
      noRetryAfter: 0,
      codes: {},
      details: [],
      requestsPerSecond: 0,
      requests: 0,
    };
    const asksMinTtl = query.includes('min_ttl');
    const before = emulator.stats.tokenRequests;
    const validate = (res: HammerResponse): string | null => {
      seen.calls++;
      if (res.status === 200) {
        seen.ok++;
        const body = JSON.parse(res.body) as TokenBody;
        // At least MIN_SERVE_MS left when the broker answered, which was before receipt.
        // The broker's own expires_in (whole seconds, rounded down) is 0 below one second.
        const left = Date.parse(body.expires_at) - res.receivedAt;
        if (body.expires_in < 1 || left < MIN_SERVE_MS - res.latencyMs - 50) seen.servedShort++;
        return null;
      }
      const problem = JSON.parse(res.body) as { code?: string; detail?: string };
      const code = `${res.status} ${problem.code}`;
      seen.codes[code] = (seen.codes[code] ?? 0) + 1;
      if (problem.detail && !seen.details.includes(problem.detail) && seen.details.length < 5) {
        seen.details.push(problem.detail);
      }
      if (!asksMinTtl && /requested min_ttl/.test(problem.detail ?? '')) seen.untruthful++;
      if (res.status === 503 && !/^[1-9]\d*$/.test(String(res.headers['retry-after'] ?? '')))
        seen.noRetryAfter++;
      return null;
    };
    const started = Date.now();
    await hammer({
      urls: brokers.map((b) => b.url),
      path: `/token?client=${FLEET_CLIENT}${query}`,
      concurrency,
      durationMs: WINDOW_MS,
      isSuccess: () => true,
      validate,
    });
    seen.requests = emulator.stats.tokenRequests - before;
    seen.requestsPerSecond = seen.requests / ((Date.now() - started) / 1000);
    return seen;
  }

  async function readiness(b: BrokerProcess): Promise<{ status: number; body: string }> {
    const res = await fetch(`${b.adminUrl!}/health/ready`);
    return { status: res.status, body: await res.text() };
  }

  /** Lines of `b`'s log naming the lifetime problem. */
  function lifetimeLogLines(b: BrokerProcess): number {
    return b.logs().filter((l) => l.includes('the broker needs to serve and refresh them')).length;
  }

  it.each([1, 2])(
    'expires_in %i: bounded provider requests, nothing served under the minimum, readiness says why',
    async (lifetimeS) => {
      emulator.setKnobs({ tokenLifetimeSeconds: lifetimeS });
      await startBrokers();
      const seen = await load('');
      figures.push(
        `expires_in ${lifetimeS}: ${seen.requestsPerSecond.toFixed(2)} token req/s (${seen.requests} in ${WINDOW_MS / 1000} s), ${seen.ok}/${seen.calls} served, ${seen.servedShort} with < 1 s left`,
      );
      // One grant per floor for the fleet (plus the first, and one in flight at each end).
      expect(seen.requests).toBeLessThanOrEqual(Math.ceil(WINDOW_MS / FLOOR_MS) + 2);
      expect(seen.servedShort).toBe(0);
      expect(seen.untruthful).toBe(0);
      expect(seen.noRetryAfter).toBe(0);
      for (const detail of seen.details) {
        expect(detail).toMatch(
          new RegExp(
            `tokens live ${lifetimeS} s, (less than the 6 s the broker needs|too short to hand out)`,
          ),
        );
      }
      for (const b of brokers) {
        const ready = await readiness(b);
        expect(ready.status).toBe(503);
        expect(ready.body).toContain('token_lifetime_too_short');
        expect(ready.body).toContain(
          `the provider's tokens live ${lifetimeS} s, less than the 6 s the broker needs to serve and refresh them`,
        );
        // One line per transition, not one per request or per refresh.
        expect(lifetimeLogLines(b)).toBeLessThanOrEqual(1);
      }
      expect(brokers.some((b) => lifetimeLogLines(b) === 1)).toBe(true);
    },
    60_000,
  );

  it('expires_in 0: bounded provider requests, no token served, readiness names the answer', async () => {
    emulator.setKnobs({ tokenLifetimeSeconds: 0 });
    await startBrokers();
    const seen = await load('');
    figures.push(
      `expires_in 0: ${seen.requestsPerSecond.toFixed(2)} token req/s (${seen.requests} in ${WINDOW_MS / 1000} s)`,
    );
    // A malformed answer: the fleet's exponential backoff (500 ms doubling) bounds it.
    expect(seen.requestsPerSecond).toBeLessThan(2);
    expect(seen.ok).toBe(0);
    expect(seen.untruthful).toBe(0);
    expect(seen.noRetryAfter).toBe(0);
    // Every replica is out of service; the ones that asked the provider themselves say why (a
    // replica the fleet's shared backoff kept from asking has no answer of its own to name).
    for (const b of brokers) expect((await readiness(b)).status).toBe(503);
    const named = await waitFor(
      async () => {
        for (const b of brokers) {
          const ready = await readiness(b);
          if (ready.body.includes('\\"expires_in\\" is zero or negative')) return ready;
        }
        return undefined;
      },
      { timeoutMs: 5000, what: 'a replica whose readiness names the provider answer' },
    );
    expect(named.status).toBe(503);
  }, 60_000);

  it('expires_in 10^9: believed for a day, one request, no timer overflow', async () => {
    emulator.setKnobs({ tokenLifetimeSeconds: 1e9 });
    await startBrokers();
    await Promise.all(brokers.map((b) => b.waitReady(10_000)));
    const before = emulator.stats.tokenRequests;
    const seen = await load('', 4);
    figures.push(`expires_in 10^9: ${seen.requests} token requests in ${WINDOW_MS / 1000} s`);
    expect(seen.ok).toBe(seen.calls);
    expect(emulator.stats.tokenRequests - before).toBe(0);
    const body = (await (
      await fetch(`${brokers[0].url}/token?client=${FLEET_CLIENT}`)
    ).json()) as TokenBody;
    expect(body.expires_in).toBeLessThanOrEqual(86_400);
    expect(body.expires_in).toBeGreaterThan(86_000);
  }, 60_000);

  it('min_ttl=59 on 60 s tokens: forced refreshes bounded by the floor, refusals say why', async () => {
    emulator.setKnobs({ tokenLifetimeSeconds: 60 });
    await startBrokers();
    await Promise.all(brokers.map((b) => b.waitReady(10_000)));
    const seen = await load('&min_ttl=59', 4);
    figures.push(
      `min_ttl=59 on 60 s: ${seen.requestsPerSecond.toFixed(2)} token req/s (${seen.requests} in ${WINDOW_MS / 1000} s), ${seen.ok}/${seen.calls} served`,
    );
    expect(seen.requests).toBeLessThanOrEqual(Math.ceil(WINDOW_MS / FLOOR_MS) + 1);
    expect(seen.servedShort).toBe(0);
    expect(seen.noRetryAfter).toBe(0);
    expect(Object.keys(seen.codes).every((c) => c === '503 token_unavailable')).toBe(true);
    for (const detail of seen.details) {
      expect(detail).toMatch(/requested min_ttl of 59 s/);
      expect(detail).toMatch(/TOKEN_MIN_REFRESH_INTERVAL_MS/);
    }
    // Callers without a min_ttl are still served from the current token throughout.
    const plain = await fetch(`${brokers[1].url}/token?client=${FLEET_CLIENT}`);
    expect(plain.status).toBe(200);
    expect((await readiness(brokers[0])).status).toBe(200);
  }, 60_000);
});
