import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { ServiceAccountIssuer } from '../emulator/service-account-issuer';
import { type BrokerProcess, spawnBroker } from './support/broker-process';
import { writeBrokerConfig } from './support/broker-config';
import { hammer } from './support/load';

const CREDS = { client_id: 'acme-merchant', client_secret: 'acme-very-secret' };
const SA = 'system:serviceaccount:shop:checkout';
const FLOOD_MS = 2000;
const CONCURRENCY = 16;

jest.setTimeout(60_000);

/**
 * What a flood of bad credentials costs a broker, against the same flood of good ones: a bad
 * API key costs one SHA-256 and a refusal; a bad service-account token a parse and at most a
 * signature check, never a JWKS fetch per attempt (unknown `kid`s refetch at most once per
 * cooldown). Short, bounded floods against 127.0.0.1; the figures are printed for the record.
 */
describe('bad-credential floods (real brokers)', () => {
  const goodKey = randomBytes(24).toString('base64url');
  let provider: ProviderEmulator;
  let issuer: ServiceAccountIssuer;
  let apiKeyBroker: BrokerProcess;
  let k8sBroker: BrokerProcess;
  let dir: string;
  const figures: string[] = [];

  beforeAll(async () => {
    provider = await ProviderEmulator.start({
      credentials: { [CREDS.client_id]: CREDS.client_secret },
    });
    issuer = await ServiceAccountIssuer.start();
    let configFile: string;
    ({ dir, configFile } = writeBrokerConfig({
      name: 'credential-flood',
      providerUrl: provider.url,
      credentials: CREDS,
      clientIds: ['acme'],
      apiKeys: [{ name: 'flood-test', key: goodKey, clients: ['*'] }],
      callerAuth: {
        kubernetes: {
          jwksUrl: issuer.jwksUrl,
          issuer: issuer.issuer,
          audience: 'token-broker',
          subjects: { [SA]: ['*'] },
        },
      },
    }));
    // Info, as in production: every refusal writes its audit line.
    const env = { BROKER_CONFIG_FILE: configFile, HOST: '127.0.0.1', LOG_LEVEL: 'info' };
    [apiKeyBroker, k8sBroker] = await Promise.all([
      spawnBroker({ name: 'api-key-broker', env: { ...env, CALLER_AUTH_MODE: 'api-key' } }),
      spawnBroker({ name: 'k8s-broker', env: { ...env, CALLER_AUTH_MODE: 'kubernetes' } }),
    ]);
    await Promise.all([apiKeyBroker.waitReady(15_000), k8sBroker.waitReady(15_000)]);
  });

  afterAll(async () => {
    await Promise.all([apiKeyBroker?.stop(), k8sBroker?.stop()]);
    await Promise.all([provider?.close(), issuer?.close()]);
    rmSync(dir, { recursive: true, force: true });
    process.stdout.write(
      `credential floods (${CONCURRENCY} concurrent, ${FLOOD_MS} ms each):\n${figures.join('\n')}\n`,
    );
  });

  async function flood(
    broker: BrokerProcess,
    what: string,
    authorization: string,
    expected: number,
  ): Promise<number> {
    const result = await hammer({
      urls: [broker.url],
      path: '/token',
      headers: { authorization },
      concurrency: CONCURRENCY,
      durationMs: FLOOD_MS,
      isSuccess: (status) => status === expected,
    });
    expect(result.failureCount).toBe(0);
    expect(result.byStatus[expected]).toBe(result.calls);
    const perSecond = Math.round((result.calls * 1000) / result.durationMs);
    figures.push(`  ${what}: ${perSecond} requests/s (${result.calls} x ${expected})`);
    return perSecond;
  }

  it('answers a flood of bad API keys at least at a third of the rate of good ones', async () => {
    const good = await flood(apiKeyBroker, 'api-key, good key', `Bearer ${goodKey}`, 200);
    const bad = await flood(
      apiKeyBroker,
      'api-key, unknown key',
      `Bearer ${randomBytes(24).toString('base64url')}`,
      401,
    );
    const huge = await flood(apiKeyBroker, 'api-key, 8 KiB key', `Bearer ${'k'.repeat(8000)}`, 401);
    expect(bad).toBeGreaterThan(good / 3);
    expect(huge).toBeGreaterThan(good / 3);
  });

  it('answers floods of bad service-account tokens without a JWKS fetch per attempt', async () => {
    const good = await flood(
      k8sBroker,
      'kubernetes, valid token (cached)',
      `Bearer ${await issuer.token({ subject: SA })}`,
      200,
    );
    const fetchesBefore = issuer.jwksRequests;
    const unknownKid = await flood(
      k8sBroker,
      'kubernetes, unknown kid',
      `Bearer ${await issuer.token({ subject: SA, kid: `random-${randomBytes(8).toString('hex')}` })}`,
      401,
    );
    const valid = await issuer.token({ subject: SA, alg: 'RS256' });
    const badSignature = `${valid.slice(0, -4)}${valid.endsWith('AAAA') ? 'BBBB' : 'AAAA'}`;
    const forged = await flood(
      k8sBroker,
      'kubernetes, known kid, bad RS256 signature',
      `Bearer ${badSignature}`,
      401,
    );
    const expired = await flood(
      k8sBroker,
      'kubernetes, expired token',
      `Bearer ${await issuer.token({ subject: SA, expiresInSeconds: -60 })}`,
      401,
    );
    // At most one refetch for the unknown kid (then the cooldown), whatever the flood's size.
    expect(issuer.jwksRequests - fetchesBefore).toBeLessThanOrEqual(1);
    for (const rate of [unknownKid, forged, expired]) expect(rate).toBeGreaterThan(good / 10);
  });
});
