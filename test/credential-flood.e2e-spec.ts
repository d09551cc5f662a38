/**
 * @alone: it times brokers under load; no other suite runs beside it (scripts/test.mjs).
 */
import { randomBytes } from 'node:crypto';
import type { ServiceAccountIssuer } from '../emulator/service-account-issuer';
import { hammer } from './support/load';
import { type Stack, type StackBroker, startStack } from './support/stack';

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
describe('bad-credential floods', () => {
  let stack: Stack;
  let goodKey: string;
  let issuer: ServiceAccountIssuer;
  let apiKeyBroker: StackBroker;
  let k8sBroker: StackBroker;
  const figures: string[] = [];

  beforeAll(async () => {
    stack = await startStack({
      name: 'credential-flood',
      inProcess: true,
      clients: ['acme'],
      callerAuth: {
        mode: 'api-key',
        callers: { 'flood-test': { clients: ['*'] } },
        subjects: { [SA]: ['*'] },
      },
      // Info, as in production: every refusal writes its audit line.
      env: { LOG_LEVEL: 'info' },
    });
    goodKey = stack.keys['flood-test'];
    issuer = stack.issuer!;
    apiKeyBroker = stack.broker;
    k8sBroker = await stack.addBroker({
      name: 'credential-flood-k8s',
      env: { CALLER_AUTH_MODE: 'kubernetes' },
    });
  });

  afterAll(async () => {
    await stack?.close();
    process.stdout.write(
      `credential floods (${CONCURRENCY} concurrent, ${FLOOD_MS} ms each):\n${figures.join('\n')}\n`,
    );
  });

  async function flood(
    broker: StackBroker,
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
