import pino from 'pino';
import type { Agent } from 'undici';
import { clientSchema, type ClientConfig } from '../src/config/client.schema';
import type { TokenSettings } from '../src/config/config.schema';
import { providerSettingsSchema, tokenSettingsSchema } from '../src/config/provider.schema';
import { redisSettingsSchema } from '../src/config/redis.schema';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { MetricsService } from '../src/metrics/metrics.service';
import { AuthServerClient } from '../src/provider/auth-server.client';
import { createProviderAgent } from '../src/provider/provider-http';
import { createRedisConnection } from '../src/redis/redis.connection';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import type { ClientCredentials } from '../src/secrets/client-credentials';
import { ClientTokenManager } from '../src/token/client-token-manager';
import { PlainTokenCipher } from '../src/token/token-cipher';
import { toRecord } from '../src/token/token-record';
import { TokenErrorCode, TokenException } from '../src/token/token.exception';
import { startRedis, type TestRedis } from './support/redis/standalone';
import { type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

// Nest 12 ships ES modules only, which Jest's CommonJS runtime cannot load; MetricsService only
// needs its class decorator from it, which does nothing outside a Nest container anyway.
jest.mock('@nestjs/common', () => ({ Injectable: () => () => undefined }));

const CLIENT_ID = 'acme-preprod';
const CREDENTIALS = { clientId: 'acme', clientSecret: 'first-secret' };
const ROTATED = { clientId: 'acme', clientSecret: 'second-secret' };
const LOCK_TTL_MS = 2000;

/** A deterministic PRNG (mulberry32): the same seed draws the same jitter on every run. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The clock every manager and the auth-server client read: real time plus an offset the test
 * moves forward. Real time underneath, because Redis (PEXPIREAT) and timers run on it.
 */
const clock = {
  offsetMs: 0,
  now: (): number => Date.now() + clock.offsetMs,
  advance(ms: number): void {
    clock.offsetMs += ms;
  },
};

interface Replica {
  manager: ClientTokenManager;
  store: RedisTokenStore;
  metrics: MetricsService;
}

/**
 * Characterisation of the token lifecycle as it is: several {@link ClientTokenManager}s in one
 * process, each on its own Redis connections (one replica each), the real Redis token store,
 * the provider emulator over HTTP with the real auth-server client, a controllable clock and
 * seeded randomness. Assertions are on what the provider saw and which token each replica holds.
 * The stack is the provider emulator and that Redis, with no broker: the managers are the
 * replicas.
 */
describe(`${ClientTokenManager.name} lifecycle`, () => {
  let redis: TestRedis;
  let set: Stack;
  let emulator: ProviderEmulator;
  let agent: Agent;
  let client: ClientConfig;
  let replicas: Replica[] = [];
  /** What the credentials source holds now, and how often it was read. */
  let secret: ClientCredentials;
  let credentialLoads = 0;
  const logger = pino({ level: 'silent' });

  function settings(overrides: Partial<TokenSettings> = {}): TokenSettings {
    return {
      ...tokenSettingsSchema.parse({
        refreshAheadSeconds: 1,
        waitTimeoutMs: 3000,
        lockTtlMs: LOCK_TTL_MS,
        backoffBaseMs: 50,
        backoffMaxMs: 1000,
        // 2 s tokens in some scenarios: the default 5 s floor would make them unservable.
        minRefreshIntervalMs: 100,
        // The fence and the invalidation themselves; their bounds have suites of their own.
        minRejectionIntervalMs: 0,
        rejectionsPerCaller: 0,
      }),
      ...overrides,
    };
  }

  async function replica(
    seed: number,
    overrides: Partial<TokenSettings> = {},
    start = true,
    readyTimeoutMs = 5000,
  ): Promise<Replica> {
    const redisSettings = redisSettingsSchema.parse({
      url: redis.url,
      commandTimeoutMs: 300,
      pingIntervalMs: 100,
    });
    const store = new RedisTokenStore(
      createRedisConnection(redisSettings, 'command'),
      createRedisConnection(redisSettings, 'subscriber'),
      new PlainTokenCipher(),
      redisSettings,
      LOCK_TTL_MS,
      [CLIENT_ID],
    );
    const metrics = new MetricsService();
    const manager = new ClientTokenManager(client, {
      store,
      grantor: new AuthServerClient(agent, providerSettingsSchema.parse({}), 1800, clock.now),
      loadCredentials: () => {
        credentialLoads++;
        return Promise.resolve(secret);
      },
      metrics,
      logger,
      settings: settings(overrides),
      storeGraceMs: 500,
      now: clock.now,
      random: seeded(seed),
    });
    store.records.onEvent((e) => manager.onStoreEvent(e));
    store.health.onRecovered(() => void manager.resync());
    const r = { manager, store, metrics };
    replicas.push(r);
    await store.health.waitUntilReady(readyTimeoutMs);
    if (start) manager.start();
    return r;
  }

  const fp = (r: Replica) => r.manager.peek(0)?.fingerprint;
  const requests = () => emulator.stats.tokenRequests;
  const counter = async (r: Replica, name: 'refreshes' | 'lockAttempts', ...labels: string[]) => {
    const metric = await r.metrics[name].get();
    return metric.values
      .filter((v) => labels.every((l) => Object.values(v.labels).includes(l)))
      .reduce((sum, v) => sum + v.value, 0);
  };

  beforeAll(async () => {
    // A local redis-server, which the tests kill and restart: started here, given to the stack.
    redis = await startRedis({ forceLocal: true });
    set = await startStack({
      name: 'lifecycle',
      replicas: 0,
      redis,
      clients: [
        {
          id: CLIENT_ID,
          credentials: { client_id: CREDENTIALS.clientId, client_secret: CREDENTIALS.clientSecret },
        },
      ],
    });
    emulator = set.provider;
    agent = createProviderAgent(providerSettingsSchema.parse({}));
    client = clientSchema.parse({
      id: CLIENT_ID,
      authUrl: emulator.url,
      baseUrl: emulator.url,
      credentials: { secretId: 'token-broker/acme-preprod' },
    });
  });

  beforeEach(() => {
    clock.offsetMs = 0;
    secret = CREDENTIALS;
    credentialLoads = 0;
    emulator.reset();
    emulator.setCredentials({ [CREDENTIALS.clientId]: CREDENTIALS.clientSecret });
    emulator.setKnobs({ tokenLifetimeSeconds: 1800, tokenLatencyMs: 0, tokenFailure: null });
  });

  afterEach(async () => {
    await Promise.all(replicas.map((r) => r.manager.stop(2000)));
    await Promise.all(replicas.map((r) => r.store.health.close()));
    replicas = [];
    if (redis.isRunning()) await redis.flush();
  });

  afterAll(async () => {
    await agent?.close();
    await set?.close();
    await redis?.stop();
  });

  it('single flight: concurrent gets on one replica cost one provider request', async () => {
    emulator.setKnobs({ tokenLatencyMs: 150 });
    const a = await replica(1, {}, false);
    const tokens = await Promise.all(Array.from({ length: 25 }, () => a.manager.get(0)));
    expect(requests()).toBe(1);
    expect(new Set(tokens.map((t) => t.fingerprint)).size).toBe(1);
    expect(fp(a)).toBe(tokens[0].fingerprint);
    expect(credentialLoads).toBe(1);
  });

  it('lock held elsewhere: the other replicas wait for the pub/sub message and adopt', async () => {
    emulator.setKnobs({ tokenLatencyMs: 300 });
    const fleet = await Promise.all([1, 2, 3].map((seed) => replica(seed, {}, false)));
    const tokens = await Promise.all(fleet.flatMap((r) => [r.manager.get(0), r.manager.get(0)]));
    expect(requests()).toBe(1);
    expect(new Set(tokens.map((t) => t.fingerprint)).size).toBe(1);
    let fetched = 0;
    let heldElsewhere = 0;
    for (const r of fleet) {
      fetched += await counter(r, 'refreshes', 'fetched');
      heldElsewhere += await counter(r, 'lockAttempts', 'held_elsewhere');
    }
    expect(fetched).toBe(1);
    expect(heldElsewhere).toBeGreaterThanOrEqual(2);
    for (const r of fleet) expect(fp(r)).toBe(tokens[0].fingerprint);
  });

  it('refresh ahead: the fleet replaces the token once, before it expires', async () => {
    emulator.setKnobs({ tokenLifetimeSeconds: 2 });
    const fleet = await Promise.all([11, 12, 13].map((seed) => replica(seed)));
    const first = await waitFor(
      () => (fleet.every((r) => fp(r)) ? fleet[0].manager.peek(0) : undefined),
      {
        timeoutMs: 3000,
        what: 'every replica to hold the first token',
      },
    );
    expect(requests()).toBe(1);
    await waitFor(() => fleet.every((r) => fp(r) !== undefined && fp(r) !== first.fingerprint), {
      timeoutMs: 3000,
      intervalMs: 10,
      what: 'every replica to hold the second token',
    });
    // Replaced ahead of expiry (lead 1 s, spread over half a second before it), by one request
    // for the fleet.
    expect(clock.now()).toBeLessThan(first.expiresAt);
    expect(requests()).toBe(2);
    expect(new Set(fleet.map(fp)).size).toBe(1);
  });

  it('an expired token is not served: the clock moving past expiry means a refresh', async () => {
    const a = await replica(21, {}, false);
    const first = await a.manager.get(0);
    expect(a.manager.peek(60_000)?.fingerprint).toBe(first.fingerprint);
    clock.advance(first.expiresAt - clock.now() - 500);
    // Less than MIN_SERVE_MS left: never handed out.
    expect(a.manager.peek(0)).toBeUndefined();
    const second = await a.manager.get(0);
    expect(second.fingerprint).not.toBe(first.fingerprint);
    expect(requests()).toBe(2);
  });

  it('bounded wait: a provider that keeps failing gives a 503 with Retry-After in time', async () => {
    emulator.setKnobs({ tokenFailure: { kind: 'status', status: 503 } });
    const a = await replica(31, { waitTimeoutMs: 400 }, false);
    const started = Date.now();
    const err = await a.manager.get(0).then(
      () => undefined,
      (e: unknown) => e,
    );
    const waited = Date.now() - started;
    expect(err).toBeInstanceOf(TokenException);
    expect((err as TokenException).code).toBe(TokenErrorCode.Unavailable);
    expect((err as TokenException).message).toContain('HTTP 503');
    expect(waited).toBeGreaterThanOrEqual(390);
    expect(waited).toBeLessThan(2000);
    // Unavailable is a 503 (src/token/token.exception.ts); this becomes its Retry-After header.
    expect((err as TokenException).retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(requests()).toBeGreaterThanOrEqual(2);
    expect(a.manager.status()).toMatchObject({ hasToken: false, everObtained: false });
  });

  it('too large a min_ttl is refused at once instead of fetching again', async () => {
    emulator.setKnobs({ tokenLifetimeSeconds: 60 });
    const a = await replica(32, {}, false);
    await a.manager.get(0);
    await expect(a.manager.get(120_000)).rejects.toMatchObject({
      code: TokenErrorCode.Unavailable,
    });
    expect(requests()).toBe(1);
  });

  it('backoff after 5xx: retries spaced by the seeded full-jitter delays, then succeeds', async () => {
    emulator.failNextTokenRequests(2, { kind: 'status', status: 500 });
    const a = await replica(41, { backoffBaseMs: 100 }, false);
    const token = await a.manager.get(0);
    expect(requests()).toBe(3);
    expect(fp(a)).toBe(token.fingerprint);
    const [t0, t1, t2] = emulator.stats.tokenRequestTimes;
    // Delays drawn from seed 41: each at least the 25 ms floor, the second cap twice the first.
    expect(t1 - t0).toBeGreaterThanOrEqual(20);
    expect(t2 - t1).toBeGreaterThanOrEqual(20);
    expect(t2 - t0).toBeLessThan(1000);
    expect(await counter(a, 'refreshes', 'transient_error')).toBe(2);
    expect(a.manager.status()).toMatchObject({ hasToken: true, lastError: undefined });
  });

  it("backoff after 429 honours the provider's Retry-After", async () => {
    emulator.failNextTokenRequests(1, { kind: 'status', status: 429, retryAfter: '1' });
    const a = await replica(42, { backoffMaxMs: 5000 }, false);
    await a.manager.get(0);
    expect(requests()).toBe(2);
    const [t0, t1] = emulator.stats.tokenRequestTimes;
    expect(t1 - t0).toBeGreaterThanOrEqual(950);
  });

  it('credential rotation: invalid_client re-reads the credentials once and retries', async () => {
    const a = await replica(51, {}, false);
    const first = await a.manager.get(0);
    expect(credentialLoads).toBe(1);
    // Rotated at the source and at the provider; the manager still caches the old secret.
    emulator.setCredentials({ [ROTATED.clientId]: ROTATED.clientSecret });
    secret = ROTATED;
    expect(await a.manager.reject(first.fingerprint, 'test')).toBe('invalidated');
    const second = await a.manager.getForwardable(0);
    expect(second.fingerprint).not.toBe(first.fingerprint);
    expect(credentialLoads).toBe(2);
    expect(emulator.stats.rejectedTokenAuth).toBe(1);
    expect(requests()).toBe(3);
  });

  it('credential rotation: unchanged credentials that are refused fail fast, naming the source', async () => {
    emulator.setCredentials({ [ROTATED.clientId]: ROTATED.clientSecret });
    const a = await replica(52, {}, false);
    await expect(a.manager.get(0)).rejects.toMatchObject({
      code: TokenErrorCode.CredentialsRejected,
      // For operators; the caller's message does not name it.
      operatorDetail: expect.stringContaining('Secrets Manager secret "token-broker/acme-preprod"'),
      message: expect.not.stringContaining('token-broker/acme-preprod'),
    });
    // Read once at first; after the refusal, the current version and the AWSPENDING and
    // AWSPREVIOUS stages once each (a Secrets Manager source): no more, and since all three
    // hold the refused credentials, no second token request.
    expect(credentialLoads).toBe(4);
    expect(requests()).toBe(1);
    const started = Date.now();
    await expect(a.manager.get(0)).rejects.toMatchObject({
      code: TokenErrorCode.CredentialsRejected,
    });
    expect(Date.now() - started).toBeLessThan(100);
    expect(a.manager.status().permanentError?.code).toBe(TokenErrorCode.CredentialsRejected);
  });

  it('credentials are re-read once they are older than credentialsReloadSeconds', async () => {
    const a = await replica(53, { credentialsReloadSeconds: 10 }, false);
    const first = await a.manager.get(0);
    await a.manager.reject(first.fingerprint, 'test');
    await a.manager.getForwardable(0);
    expect(credentialLoads).toBe(1);
    clock.advance(11_000);
    const third = await a.manager.get(0);
    await a.manager.reject(third.fingerprint, 'test');
    await a.manager.getForwardable(0);
    expect(credentialLoads).toBe(2);
  });

  it('fenced write losing: a slower refresh never overwrites a newer stored token', async () => {
    emulator.setKnobs({ tokenLatencyMs: 300 });
    const a = await replica(61, {}, false);
    const pending = a.manager.get(0);
    await waitFor(() => requests() === 1, { timeoutMs: 2000, what: 'the token request' });
    // Another writer stores a token that outlives the one in flight.
    const newer = toRecord({
      accessToken: 'written-by-another-replica',
      obtainedAt: clock.now(),
      expiresAt: clock.now() + 3_600_000,
    });
    const other = await replica(62, {}, false);
    expect(await other.store.records.writeFenced(CLIENT_ID, newer)).toBe(true);
    const mine = await pending;
    expect(mine.fingerprint).not.toBe(newer.fingerprint);
    const stored = await other.store.records.read(CLIENT_ID);
    expect(stored).toMatchObject({ status: 'found', record: { fingerprint: newer.fingerprint } });
    // The idle replica adopted the newer token from the pub/sub message.
    await waitFor(() => fp(other) === newer.fingerprint, {
      timeoutMs: 2000,
      what: 'the idle replica to adopt the newer token',
    });
    expect(requests()).toBe(1);
  });

  it('invalidation by fingerprint: a storm of rejections of one token costs one refresh', async () => {
    const fleet = await Promise.all([71, 72, 73].map((seed) => replica(seed, {}, false)));
    const first = await fleet[0].manager.get(0);
    await Promise.all(fleet.slice(1).map((r) => r.manager.get(0)));
    expect(requests()).toBe(1);
    const results = await Promise.all(
      Array.from({ length: 30 }, (_, i) => fleet[i % 3].manager.reject(first.fingerprint, 'test')),
    );
    expect(results.filter((v) => v === 'invalidated').length).toBeGreaterThanOrEqual(1);
    await waitFor(() => fleet.every((r) => fp(r) !== undefined && fp(r) !== first.fingerprint), {
      timeoutMs: 3000,
      what: 'every replica to hold a replacement token',
    });
    expect(requests()).toBe(2);
    expect(new Set(fleet.map(fp)).size).toBe(1);
    // The stale fingerprint no longer invalidates anything.
    expect(await fleet[0].manager.reject(first.fingerprint, 'test')).toBe('stale');
    expect(requests()).toBe(2);
  });

  it('a rejected token is never adopted again, even when the store hands it back', async () => {
    const a = await replica(75, {}, false);
    const rejected = await a.manager.get(0);
    expect(await a.manager.reject(rejected.fingerprint, 'test')).toBe('invalidated');
    const replacement = await a.manager.getForwardable(0);
    expect(replacement.fingerprint).not.toBe(rejected.fingerprint);
    // A write that began before the rejection lands now, the same token with a later expiry:
    // the pub/sub message and the store read both offer it; the manager keeps its replacement.
    const writer = await replica(76, {}, false);
    const stale = toRecord({
      accessToken: rejected.accessToken,
      obtainedAt: rejected.obtainedAt,
      expiresAt: replacement.expiresAt + 60_000,
    });
    expect(await writer.store.records.writeFenced(CLIENT_ID, stale)).toBe(true);
    await waitFor(() => fp(writer) === stale.fingerprint, {
      timeoutMs: 2000,
      what: 'the pub/sub message to reach the replicas',
    });
    expect(fp(a)).toBe(replacement.fingerprint);
    // The store holds the stale copy now, so the store has nothing to invalidate; the refresh
    // finds that copy and fetches a new one instead.
    expect(await a.manager.reject(replacement.fingerprint, 'test')).toBe('stale');
    const third = await a.manager.getForwardable(0);
    expect([rejected.fingerprint, replacement.fingerprint]).not.toContain(third.fingerprint);
    expect(requests()).toBe(3);
  });

  it('resync: Redis restarted empty gets the replica token back without a provider call', async () => {
    const a = await replica(81, {}, false);
    const token = await a.manager.get(0);
    await redis.restart();
    await waitFor(
      async () => {
        const stored = await a.store.records.read(CLIENT_ID);
        return stored.status === 'found' && stored.record.fingerprint === token.fingerprint;
      },
      { timeoutMs: 8000, what: 'the replica to write its token back' },
    );
    expect(requests()).toBe(1);
    expect(fp(a)).toBe(token.fingerprint);
  });

  it('degraded: with Redis gone past the grace period a replica fetches on its own', async () => {
    const a = await replica(91, {}, false);
    await a.manager.get(0);
    await redis.kill();
    const other = await replica(92, {}, false, 100);
    const own = await other.manager.get(0);
    expect(requests()).toBe(2);
    expect(fp(other)).toBe(own.fingerprint);
    // Redis back: the degraded replica pushes its token, the first one converges on the newest.
    await redis.restart();
    await waitFor(() => fp(a) === own.fingerprint, {
      timeoutMs: 8000,
      what: 'the first replica to converge on the newest token',
    });
    expect(requests()).toBe(2);
  });
});
