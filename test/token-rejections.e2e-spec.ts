import { type Stack, startStack } from './support/stack';
import { metricValue } from './support/token-watch';
import { waitFor } from './support/wait';

// A Redis and two brokers on a shared machine take more than Jest's 5 s to start.
jest.setTimeout(120_000);

/** Each scenario has a client of its own: the rejection floor of one must not bound the next. */
const CHURN = 'churn';
const LIMITED = 'limited';
const REISSUE = 'reissue';
const REFUSED = { 'www-authenticate': 'Bearer realm="api", error="invalid_token"' };

interface Answer {
  status: number;
  text: string;
}

/**
 * A provider that answers 401 `invalid_token` to what a forward-only caller controls (a wrong
 * one-time code, a missing consent), and a token caller beside it: the caller with the
 * `forward` scope must not be able to drive the fleet's token away from the other.
 */
describe('provider 401s on forwarded calls (2 brokers, real Redis, api-key callers)', () => {
  let fleet: Stack;

  async function call(path: string, caller: string, broker = 0): Promise<Answer> {
    const res = await fetch(`${fleet.brokers[broker].url}${path}`, {
      headers: { authorization: `Bearer ${fleet.keys[caller]}` },
    });
    return { status: res.status, text: await res.text() };
  }

  const forwarded = (client: string, broker = 0) =>
    call(`/provider/${client}/api/marketing/v1/offers?otp=000000`, 'shop-proxy', broker);
  const token = async (client: string, broker = 0) => {
    const answer = await call(`/token?client=${client}`, 'shop-token', broker);
    return {
      status: answer.status,
      token: answer.status === 200 ? (JSON.parse(answer.text) as { access_token: string }) : null,
    };
  };

  beforeAll(async () => {
    fleet = await startStack({
      name: 'rejections',
      inProcess: true,
      clients: [CHURN, LIMITED, REISSUE],
      redis: 'standalone',
      replicas: 2,
      cacheKey: true,
      callerAuth: {
        mode: 'api-key',
        callers: {
          'shop-proxy': { clients: ['*'], scopes: ['forward'] },
          'shop-token': { clients: ['*'], scopes: ['token'] },
          oncall: { clients: ['*'], scopes: ['admin'] },
        },
      },
      env: {
        LOG_LEVEL: 'error',
        FORWARD_CLIENT_RATE_PER_SECOND: '0',
        FORWARD_CALLER_RATE_PER_SECOND: '0',
      },
    });
  });
  afterEach(() => fleet.provider.reset());
  afterAll(async () => {
    await fleet?.close();
  });

  it('50 forward-only 401s cost at most one token request; the token caller is always served', async () => {
    const before = fleet.provider.stats.tokenRequests;
    const held = await token(CHURN);
    expect(held.status).toBe(200);
    fleet.provider.setKnobs({ apiFailure: { kind: 'status', status: 401, headers: REFUSED } });
    const statuses = new Map<number, number>();
    const tokenStatuses: number[] = [];
    const started = Date.now();
    for (let i = 0; i < 50; i++) {
      const answer = await forwarded(CHURN, i % 2);
      statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
      tokenStatuses.push((await token(CHURN, (i + 1) % 2)).status);
    }
    const tokenRequests = fleet.provider.stats.tokenRequests - before;
    console.log(
      `50 forward-only 401s in ${Date.now() - started} ms: ${tokenRequests} token request(s); answers ${JSON.stringify(Object.fromEntries(statuses))}; GET /token ${tokenStatuses.filter((s) => s === 200).length}/50 answered 200`,
    );
    expect(tokenRequests).toBeLessThanOrEqual(1);
    expect(tokenStatuses.every((s) => s === 200)).toBe(true);
    // The first refusal is retried once with the replacement; the others are relayed.
    expect(statuses.get(401)).toBeGreaterThanOrEqual(49);
    const floored = await Promise.all(
      [0, 1].map((b) =>
        metricValue(fleet.brokers[b].url, 'token_broker_token_rejections_total', {
          client: CHURN,
          call: 'forward',
          verdict: 'floored',
        }),
      ),
    );
    expect(floored[0] + floored[1]).toBeGreaterThanOrEqual(48);
  });

  it('a 401 that does not say the token was refused is relayed and costs nothing', async () => {
    const before = fleet.provider.stats;
    fleet.provider.setKnobs({
      apiFailure: { kind: 'status', status: 401, body: '{"error":"otp_invalid"}' },
    });
    for (let i = 0; i < 10; i++) {
      const answer = await forwarded(LIMITED, i % 2);
      expect(answer).toEqual({ status: 401, text: '{"error":"otp_invalid"}' });
    }
    const after = fleet.provider.stats;
    expect(after.tokenRequests).toBe(0);
    // Each call reached the provider once: an ambiguous 401 is never resent.
    expect(after.apiRequests).toBe(10);
    expect(before.tokenRequests).toBe(0);
  });

  it('with 10 grants a minute at the token endpoint, 20 forward-only 401s leave the token caller served', async () => {
    fleet.provider.setKnobs({
      tokenGrantsPerMinute: 10,
      apiFailure: { kind: 'status', status: 401, headers: REFUSED },
    });
    let served = 0;
    let asked = 0;
    for (let i = 0; i < 20; i++) {
      await forwarded(LIMITED, i % 2);
      for (const b of [0, 1]) {
        asked++;
        if ((await token(LIMITED, b)).status === 200) served++;
      }
    }
    console.log(
      `token endpoint at 10 grants/min, 20 forward-only 401s: GET /token ${served}/${asked} answered; ${fleet.provider.stats.tokenRequests} token request(s), ${fleet.provider.stats.rateLimitedTokenRequests} refused 429`,
    );
    expect(served).toBe(asked);
    expect(fleet.provider.stats.rateLimitedTokenRequests).toBe(0);
    expect(fleet.provider.stats.tokenRequests).toBeLessThanOrEqual(1);
  });

  it('a provider that re-issues the same token: the token granted after the refusal is current', async () => {
    fleet.provider.setKnobs({ reissueTokens: true });
    const held = await token(REISSUE);
    expect(held.status).toBe(200);
    fleet.provider.rejectNextCalls(1);
    const answer = await forwarded(REISSUE);
    // Refused once, invalidated, the same token granted again, and the call sent with it.
    expect(answer.status).toBe(200);
    const stats = fleet.provider.stats;
    expect(stats.tokenRequests).toBe(1);
    expect(stats.tokensReissued).toBe(1);
    expect(stats.apiRequests).toBe(2);
    for (const b of [0, 1]) {
      expect((await forwarded(REISSUE, b)).status).toBe(200);
      expect((await token(REISSUE, b)).token?.access_token).toBe(held.token?.access_token);
    }
    // No polling: the fence took the re-issued token, so nobody asks the provider again.
    await new Promise((resolve) => setTimeout(resolve, 1500));
    expect(fleet.provider.stats.tokenRequests).toBe(1);

    // An operator's revoke: the provider hands the same token back, and the answer says so.
    const res = await fetch(`${fleet.brokers[0].url}/admin/clients/${REISSUE}/revoke`, {
      method: 'POST',
      headers: { authorization: `Bearer ${fleet.keys.oncall}` },
    });
    expect(res.status).toBe(200);
    const revoked = (await res.json()) as {
      revokedFingerprint: string;
      replacement: { fingerprint: string; reissued: boolean } | null;
      warning?: string;
    };
    expect(revoked.replacement).toMatchObject({
      fingerprint: revoked.revokedFingerprint,
      reissued: true,
    });
    expect(revoked.warning).toMatch(/revoke it at the provider/);
    // The fleet is not locked out until expiry: both replicas serve and forward with it.
    for (const b of [0, 1]) {
      await waitFor(async () => (await token(REISSUE, b)).status === 200, {
        timeoutMs: 5000,
        what: `replica ${b} to serve the re-issued token`,
      });
      expect((await forwarded(REISSUE, b)).status).toBe(200);
    }
    expect(fleet.provider.stats.tokenRequests).toBe(2);
  });
});
