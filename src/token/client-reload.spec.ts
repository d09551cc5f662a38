import pino from 'pino';
import { TEST_CLIENT, testConfig } from '../../test/support/test-config';
import type { ClientInput } from '../../test/support/test-config';
import { MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { GrantedToken } from '../provider/token-response.parser';
import type { SecretReader } from '../secrets/secret-reader';
import { MemoryTokenStore } from './token-store.memory';
import { TokenErrorCode } from './token.exception';
import { TokenService } from './token.service';

// Nest 12 ships ES modules only; the service needs only its decorators, which do nothing here.
jest.mock('@nestjs/common', () => ({
  Inject: () => () => undefined,
  Injectable: () => () => undefined,
}));

/** Issues `<client>-<n>` for an hour; a client in `hanging` is never answered. */
class Grantor implements TokenGrantor {
  readonly requests = new Map<string, number>();
  readonly hanging = new Set<string>();
  async requestToken(client: { id: string }): Promise<GrantedToken> {
    if (this.hanging.has(client.id)) return new Promise(() => undefined);
    const n = (this.requests.get(client.id) ?? 0) + 1;
    this.requests.set(client.id, n);
    const now = Date.now();
    return {
      accessToken: `${client.id}-${n}`,
      obtainedAt: now,
      expiresAt: now + 3_600_000,
      lifetimeSeconds: 3600,
    };
  }
}

const secrets: SecretReader = {
  read: () => Promise.resolve('{"client_id":"id","client_secret":"secret"}'),
};

const clients = (...entries: (string | ClientInput)[]) =>
  entries.map((c) => (typeof c === 'string' ? { ...TEST_CLIENT, id: c } : c));

/** The client list of a running {@link TokenService}, replaced by {@link TokenService.applyClients}. */
describe('TokenService.applyClients', () => {
  const services: TokenService[] = [];
  let grantor: Grantor;
  let metrics: MetricsService;
  let s: TokenService;

  beforeEach(async () => {
    grantor = new Grantor();
    metrics = new MetricsService();
    const store = new MemoryTokenStore();
    const config = testConfig({
      clients: clients('acme', 'beta', 'slow'),
      http: { host: '127.0.0.1', shutdownGraceMs: 400 },
      token: { waitTimeoutMs: 10_000 },
    });
    s = new TokenService(config, store, grantor, secrets, pino({ level: 'silent' }), metrics);
    services.push(s);
    grantor.hanging.add('slow');
    await s.onApplicationBootstrap();
  });

  afterEach(async () => {
    await Promise.all(services.splice(0).map((x) => x.beforeApplicationShutdown()));
  });

  it('starts new clients, stops removed ones (their waiters refused) and follows the sole client', async () => {
    await s.getToken('acme', 0);
    const waiting = s.getToken('slow', 0);
    const changes = await s.applyClients(
      testConfig({ clients: clients('acme', 'gamma'), readiness: { requiredClients: ['gamma'] } }),
    );
    expect(changes).toEqual({ added: ['gamma'], removed: ['beta', 'slow'], changed: [] });
    await expect(waiting).rejects.toMatchObject({
      code: TokenErrorCode.UnknownClient,
      message: 'client "slow" was removed from the configuration while the request waited',
    });
    expect((await s.getToken('gamma', 0)).accessToken).toBe('gamma-1');
    expect(() => s.resolveClient('beta')).toThrow(
      expect.objectContaining({ code: TokenErrorCode.UnknownClient }),
    );
    expect(s.status().clients.map((c) => c.client)).toEqual(['acme', 'gamma']);
    expect(s.requiredClients).toEqual(['gamma']);
    // Its metric series are gone with it.
    expect(await metrics.registry.metrics()).not.toContain('client="beta"');

    await s.applyClients(testConfig({ clients: clients('gamma') }));
    expect(s.resolveClient(undefined)).toBe('gamma');
  });

  it("keeps a changed client's token when only where its calls go changed, else restarts it", async () => {
    const first = await s.getToken('acme', 0);
    const moved = { ...TEST_CLIENT, id: 'acme', ordersPath: '/v2/orders' };
    expect(await s.applyClients(testConfig({ clients: clients(moved, 'beta') }))).toEqual({
      added: [],
      removed: ['slow'],
      changed: ['acme'],
    });
    expect(s.clientConfig('acme').ordersPath).toBe('/v2/orders');
    expect(s.peek('acme', 0)?.accessToken).toBe(first.accessToken);

    // A token setting changed: a new manager, which adopts the fleet's stored token.
    const rotated = { ...moved, credentials: { file: '/run/secrets/acme-v2' } };
    expect(await s.applyClients(testConfig({ clients: clients(rotated, 'beta') }))).toEqual({
      added: [],
      removed: [],
      changed: ['acme'],
    });
    expect((await s.getToken('acme', 0)).accessToken).toBe(first.accessToken);
    expect(grantor.requests.get('acme')).toBe(1);
  });
});
