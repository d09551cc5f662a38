import pino from 'pino';
import { type BrokerConfigInput, TEST_CLIENT, testConfig } from '../../test/support/test-config';
import { MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { GrantedToken } from '../provider/token-response.parser';
import type { SecretReader } from '../secrets/secret-reader';
import { TokenStoreErrorCode, TokenStoreException } from './token-store.exception';
import { MemoryTokenStore } from './token-store.memory';
import { TokenErrorCode } from './token.exception';
import { TokenService } from './token.service';

// Nest 12 ships ES modules only, which Jest's CommonJS runtime cannot load; the service only
// needs its decorators from it, which do nothing outside a Nest container anyway.
jest.mock('@nestjs/common', () => ({
  Inject: () => () => undefined,
  Injectable: () => () => undefined,
}));

/** A provider that issues `token-<n>` for an hour and counts requests. */
class Grantor implements TokenGrantor {
  requests = 0;
  async requestToken(): Promise<GrantedToken> {
    const now = Date.now();
    return {
      accessToken: `token-${++this.requests}`,
      obtainedAt: now,
      expiresAt: now + 3_600_000,
      lifetimeSeconds: 3600,
    };
  }
}

const secrets: SecretReader = {
  read: () => Promise.resolve('{"client_id":"id","client_secret":"secret"}'),
};

describe(TokenService.name, () => {
  const services: TokenService[] = [];

  function service(
    ids: string[],
    grantor = new Grantor(),
    store = new MemoryTokenStore(),
    token: BrokerConfigInput['token'] = {},
  ) {
    const config = testConfig({ clients: ids.map((id) => ({ ...TEST_CLIENT, id })), token });
    const metrics = new MetricsService();
    const s = new TokenService(config, store, grantor, secrets, pino({ level: 'silent' }), metrics);
    services.push(s);
    return { s, grantor, metrics };
  }

  afterEach(async () => {
    await Promise.all(services.splice(0).map((s) => s.beforeApplicationShutdown()));
  });

  describe('resolveClient', () => {
    it('takes the sole client when none is named', () => {
      const { s } = service(['acme']);
      expect(s.resolveClient(undefined)).toBe('acme');
      expect(s.resolveClient('acme')).toBe('acme');
    });

    it('requires a name when several clients are configured, listing them', () => {
      const { s } = service(['acme', 'beta']);
      expect(() => s.resolveClient(undefined)).toThrow(
        expect.objectContaining({
          code: TokenErrorCode.ClientRequired,
          message: 'several clients are configured; pass ?client=<id> (one of: acme, beta)',
        }),
      );
    });

    it('refuses an unknown client, echoing only what could be an id', () => {
      const { s } = service(['acme']);
      expect(() => s.resolveClient('other')).toThrow(
        expect.objectContaining({
          code: TokenErrorCode.UnknownClient,
          message: 'no client "other" is configured on this broker',
        }),
      );
      expect(() => s.resolveClient('eyJhbGciOi.Bearer SECRET')).toThrow(
        'no client with the requested id is configured on this broker',
      );
    });
  });

  it('peek reads L1 without I/O and counts only hits', async () => {
    const { s, metrics } = service(['acme']);
    expect(s.peek('acme', 0)).toBeUndefined();
    expect(s.peek('unknown', 0)).toBeUndefined();
    const token = await s.getToken('acme', 0);
    expect(s.peek('acme', 0)).toBe(token);
    expect(s.peek('acme', 0)).toBe(token);
    expect(s.peek('acme', 7_200_000)).toBeUndefined();
    const lookups = await metrics.cacheLookups.get();
    expect(lookups.values.find((v) => v.labels.layer === 'l1')).toMatchObject({
      labels: { outcome: 'hit' },
      value: 2,
    });
  });

  it('replaceRejected: forwarded calls get a different token, a storm costs one fetch, GET /token keeps the old one until then', async () => {
    const { s, grantor } = service(['acme'], new Grantor(), new MemoryTokenStore(), {
      minRefreshIntervalMs: 100,
    });
    const first = await s.getToken('acme', 0);
    const verdicts = await Promise.all(
      Array.from({ length: 10 }, () => s.replaceRejected('acme', first.fingerprint, 'proxy')),
    );
    expect(verdicts.filter((v) => v === 'invalidated')).toHaveLength(1);
    expect(new Set(verdicts)).toEqual(new Set(['invalidated', 'stale']));
    // Until the replacement is in hand, the refused token is still the one served.
    expect(s.peek('acme', 0)).toBe(first);
    const second = await s.getForwardToken('acme', 0);
    expect(second.fingerprint).not.toBe(first.fingerprint);
    expect(grantor.requests).toBe(2);
    expect(await s.replaceRejected('acme', first.fingerprint, 'proxy')).toBe('stale');
    expect(s.peek('acme', 0)).toBe(second);
  });

  it('replaceRejected within the rejection floor invalidates nothing and costs no fetch', async () => {
    const { s, grantor } = service(['acme'], new Grantor(), new MemoryTokenStore(), {
      minRefreshIntervalMs: 100,
      minRejectionIntervalMs: 60_000,
    });
    const first = await s.getToken('acme', 0);
    expect(await s.replaceRejected('acme', first.fingerprint, 'proxy')).toBe('invalidated');
    const second = await s.getForwardToken('acme', 0);
    expect(await s.replaceRejected('acme', second.fingerprint, 'proxy')).toBe('floored');
    expect(await s.getForwardToken('acme', 0)).toBe(second);
    expect(grantor.requests).toBe(2);
  });

  it("replaceRejected past a caller's budget invalidates nothing; other callers keep theirs", async () => {
    const { s, grantor } = service(['acme'], new Grantor(), new MemoryTokenStore(), {
      minRefreshIntervalMs: 100,
      minRejectionIntervalMs: 0,
      rejectionsPerCaller: 1,
    });
    const first = await s.getToken('acme', 0);
    expect(await s.replaceRejected('acme', first.fingerprint, 'proxy')).toBe('invalidated');
    const second = await s.getForwardToken('acme', 0);
    expect(await s.replaceRejected('acme', second.fingerprint, 'proxy')).toBe('caller_budget');
    expect(await s.replaceRejected('acme', second.fingerprint, 'other')).toBe('invalidated');
    const third = await s.getForwardToken('acme', 0);
    expect(third.fingerprint).not.toBe(second.fingerprint);
    expect(grantor.requests).toBe(3);
  });

  it('getToken and replaceRejected refuse an unknown client like resolveClient', async () => {
    const { s } = service(['acme']);
    await expect(s.getToken('nope', 0)).rejects.toMatchObject({
      code: TokenErrorCode.UnknownClient,
    });
    await expect(s.replaceRejected('nope', 'fp', 'proxy')).rejects.toMatchObject({
      code: TokenErrorCode.UnknownClient,
    });
  });

  it('computes the remaining lifetime and servability at scrape time, 0 with no token', async () => {
    const { s, metrics } = service(['acme', 'beta']);
    await s.getToken('acme', 0);
    const text = await metrics.registry.metrics();
    const value = (series: string) => {
      const line = text.split('\n').find((l) => l.startsWith(`${series} `));
      return line === undefined ? undefined : Number(line.slice(series.length + 1));
    };
    expect(value('token_broker_token_remaining_seconds{client="acme"}')).toBeGreaterThan(3590);
    expect(value('token_broker_token_remaining_seconds{client="acme"}')).toBeLessThanOrEqual(3600);
    expect(value('token_broker_token_remaining_seconds{client="beta"}')).toBe(0);
    // Only the client that cannot be served has a series of its own.
    expect(value('token_broker_client_unservable{client="beta"}')).toBe(1);
    expect(value('token_broker_client_unservable{client="acme"}')).toBeUndefined();
    expect(value('token_broker_clients{state="fresh"}')).toBe(1);
    expect(value('token_broker_clients{state="failed"}')).toBe(0);
  });

  it('costs one series per healthy client, whatever their number', async () => {
    const ids = Array.from({ length: 200 }, (_, i) => `merchant-${String(i).padStart(4, '0')}`);
    // The endpoint's bound would spread 200 first tokens over 10 s: lifted here.
    const { s, metrics } = service(ids, new Grantor(), new MemoryTokenStore(), {
      endpointMaxConcurrency: 0,
      endpointRatePerSecond: 0,
    });
    await Promise.all(ids.map((id) => s.getToken(id, 0)));
    s.peek(ids[0], 0);
    const perClient = (await metrics.registry.metrics())
      .split('\n')
      .filter((l) => /client="merchant-\d{4}"/.test(l));
    expect(perClient).toHaveLength(ids.length);
    expect(perClient.every((l) => l.startsWith('token_broker_token_remaining_seconds{'))).toBe(
      true,
    );
  });

  it('status reports each client and the store', async () => {
    const store = new MemoryTokenStore();
    const { s } = service(['acme', 'beta'], new Grantor(), store);
    await s.getToken('acme', 0);
    const status = s.status();
    expect(status.store).toEqual({ kind: 'memory', healthy: true });
    expect(status.clients.map((c) => [c.client, c.hasToken])).toEqual([
      ['acme', true],
      ['beta', false],
    ]);
  });

  it('keeps serving from memory when the store fails', async () => {
    const store = new MemoryTokenStore();
    const { s } = service(['acme'], new Grantor(), store);
    const token = await s.getToken('acme', 0);
    store.invalidate = () =>
      Promise.reject(new TokenStoreException(TokenStoreErrorCode.Unavailable, 'down'));
    expect(await s.replaceRejected('acme', 'another-fingerprint', 'proxy')).toBe('stale');
    expect(s.peek('acme', 0)).toBe(token);
  });
});
