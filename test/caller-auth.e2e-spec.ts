import { createHash, createHmac, randomBytes } from 'node:crypto';
import { SignJWT } from 'jose';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import type { ServiceAccountIssuer } from '../emulator/service-account-issuer';
import { CALLER_CLIENTS, CHECKOUT_SA } from './support/caller-brokers';
import { newKey, sha256, type Stack, type StackBroker, startStack } from './support/stack';
import { waitFor } from './support/wait';

const BILLING_SA = 'system:serviceaccount:shop:billing';
const STRANGER_SA = 'system:serviceaccount:other:stranger';

const b64 = (json: unknown) => Buffer.from(JSON.stringify(json)).toString('base64url');

interface Answer {
  status: number;
  headers: Headers;
  body: { code?: string; detail?: string; access_token?: string };
}

/**
 * Caller authentication against two brokers in the Jest process, over HTTP: one in mode
 * `api-key` (hashes in Secrets Manager), one in mode `kubernetes` (a local JWKS), both at
 * LOG_LEVEL=debug so that the last test can assert that nothing secret was ever logged.
 */
// Jest applies `testTimeout` only at the top level of its config, not per project, and
// generating RSA keys can take seconds on a busy machine.
jest.setTimeout(60_000);

describe('caller authentication', () => {
  let checkoutKey: string;
  let opsKey: string;
  /** Every credential presented and every token seen: none may appear in a log. */
  const secretsSeen = new Set<string>();
  let set: Stack;
  let provider: ProviderEmulator;
  let issuer: ServiceAccountIssuer;
  let apiKeyBroker: StackBroker;
  let k8sBroker: StackBroker;

  async function call(broker: StackBroker, path: string, authorization?: string): Promise<Answer> {
    if (authorization) secretsSeen.add(authorization.replace(/^\S+\s+/, '').trim());
    const res = await fetch(`${broker.url}${path}`, {
      headers: authorization === undefined ? {} : { authorization },
    });
    const body = (await res.json()) as Answer['body'];
    if (body.access_token) secretsSeen.add(body.access_token);
    return { status: res.status, headers: res.headers, body };
  }

  const saToken = async (opts: Parameters<ServiceAccountIssuer['token']>[0]) =>
    `Bearer ${await issuer.token(opts)}`;

  beforeAll(async () => {
    set = await startStack({
      name: 'caller-auth',
      inProcess: true,
      clients: CALLER_CLIENTS,
      secrets: 'secrets-manager',
      callerAuth: {
        mode: 'api-key',
        callers: {
          checkout: { clients: ['acme-prod'] },
          ops: { clients: ['*'] },
          proxy: { clients: ['acme-prod'], scopes: ['forward'] },
          reader: { clients: ['acme-prod'], scopes: ['token'] },
        },
        subjects: { [CHECKOUT_SA]: ['acme-prod'], [BILLING_SA]: ['globex-prod'] },
      },
    });
    provider = set.provider;
    issuer = set.issuer!;
    apiKeyBroker = set.broker;
    k8sBroker = await set.addBroker({
      name: 'caller-auth-k8s',
      env: { CALLER_AUTH_MODE: 'kubernetes', CALLER_API_KEYS_SECRET_ID: undefined },
    });
    ({ checkout: checkoutKey, ops: opsKey } = set.keys);
    // The provider secrets and both API keys.
    for (const secret of set.secretValues) secretsSeen.add(secret);
  });

  afterAll(async () => {
    await set?.close();
  });

  describe('good callers', () => {
    it('serves an API key its granted clients, "*" every client', async () => {
      const a = await call(apiKeyBroker, '/token?client=acme-prod', `Bearer ${checkoutKey}`);
      expect(a.status).toBe(200);
      expect(provider.isValidToken(a.body.access_token!)).toBe(true);
      const g = await call(apiKeyBroker, '/token?client=globex-prod', `Bearer ${opsKey}`);
      expect(g.status).toBe(200);
      expect(g.body.access_token).not.toBe(a.body.access_token);
    });

    it.each(['RS256', 'ES256'] as const)(
      'serves a %s service-account token its granted client',
      async (alg) => {
        const res = await call(
          k8sBroker,
          '/token?client=acme-prod',
          await saToken({ subject: CHECKOUT_SA, alg }),
        );
        expect(res.status).toBe(200);
        expect(provider.isValidToken(res.body.access_token!)).toBe(true);
      },
    );

    it('verifies a service-account token once, then answers from the cache', async () => {
      const header = await saToken({ subject: BILLING_SA });
      const before = issuer.jwksRequests;
      const answers = await Promise.all(
        Array.from({ length: 20 }, () => call(k8sBroker, '/token?client=globex-prod', header)),
      );
      expect(answers.map((a) => a.status)).toEqual(Array(20).fill(200));
      expect(issuer.jwksRequests).toBe(before);
    });

    it('needs no credential for health and metrics', async () => {
      for (const b of [apiKeyBroker, k8sBroker]) {
        expect((await fetch(`${b.url}/health/live`)).status).toBe(200);
        expect((await fetch(`${b.url}/health/ready`)).status).toBe(200);
        expect((await fetch(`${b.url}/metrics`)).status).toBe(200);
      }
    });
  });

  type Case = [
    string,
    'api-key' | 'kubernetes',
    string,
    401 | 403,
    () => Promise<string | undefined>,
  ];
  const cases: Case[] = [
    ['no Authorization header', 'api-key', 'acme-prod', 401, async () => undefined],
    ['an empty Authorization header', 'api-key', 'acme-prod', 401, async () => ''],
    [
      'the Basic scheme',
      'api-key',
      'acme-prod',
      401,
      async () => `Basic ${b64(`x:${checkoutKey}`)}`,
    ],
    ['the key without a scheme', 'api-key', 'acme-prod', 401, async () => checkoutKey],
    ['a wrong key', 'api-key', 'acme-prod', 401, async () => `Bearer ${newKey()}`],
    [
      'the hash of the key',
      'api-key',
      'acme-prod',
      401,
      async () => `Bearer ${sha256(checkoutKey)}`,
    ],
    [
      'a key for another client',
      'api-key',
      'globex-prod',
      403,
      async () => `Bearer ${checkoutKey}`,
    ],
    [
      'a valid service-account token in api-key mode',
      'api-key',
      'acme-prod',
      401,
      () => saToken({ subject: CHECKOUT_SA }),
    ],
    ['"Bearer" alone', 'api-key', 'acme-prod', 401, async () => 'Bearer'],
    ['garbage', 'api-key', 'acme-prod', 401, async () => '}{ garbage ¿? \u00ff'],
    ['a huge credential', 'api-key', 'acme-prod', 401, async () => `Bearer ${'A'.repeat(12_000)}`],
    ['no Authorization header', 'kubernetes', 'acme-prod', 401, async () => undefined],
    [
      'an expired token',
      'kubernetes',
      'acme-prod',
      401,
      () => saToken({ subject: CHECKOUT_SA, expiresInSeconds: -120 }),
    ],
    [
      'a token for another audience',
      'kubernetes',
      'acme-prod',
      401,
      () => saToken({ subject: CHECKOUT_SA, audience: 'vault' }),
    ],
    [
      'a token from another issuer',
      'kubernetes',
      'acme-prod',
      401,
      () => saToken({ subject: CHECKOUT_SA, issuer: 'https://other-cluster.example' }),
    ],
    [
      'a token with an unknown kid',
      'kubernetes',
      'acme-prod',
      401,
      () => saToken({ subject: CHECKOUT_SA, unpublishedKey: true }),
    ],
    [
      'a token with alg none',
      'kubernetes',
      'acme-prod',
      401,
      async () => {
        const [, payload] = (await issuer.token({ subject: CHECKOUT_SA })).split('.');
        return `Bearer ${b64({ alg: 'none', typ: 'JWT' })}.${payload}.`;
      },
    ],
    [
      'a token with a tampered signature',
      'kubernetes',
      'acme-prod',
      401,
      async () => {
        const [h, p, s] = (await issuer.token({ subject: CHECKOUT_SA, alg: 'RS256' })).split('.');
        const sig = Buffer.from(s, 'base64url');
        sig[0] ^= 0xff;
        return `Bearer ${h}.${p}.${sig.toString('base64url')}`;
      },
    ],
    [
      'a token whose payload was swapped for a granted subject',
      'kubernetes',
      'globex-prod',
      401,
      async () => {
        const [h, , s] = (await issuer.token({ subject: CHECKOUT_SA })).split('.');
        const p = b64({
          iss: issuer.issuer,
          sub: BILLING_SA,
          aud: ['token-broker'],
          exp: Math.floor(Date.now() / 1000) + 600,
        });
        return `Bearer ${h}.${p}.${s}`;
      },
    ],
    [
      'an HS256 token signed with the public key',
      'kubernetes',
      'acme-prod',
      401,
      async () => {
        const jwk = issuer.publicJwks.find((k) => k.kty === 'RSA')!;
        const token = await new SignJWT({
          sub: CHECKOUT_SA,
          aud: 'token-broker',
          iss: issuer.issuer,
        })
          .setProtectedHeader({ alg: 'HS256', kid: jwk.kid })
          .setExpirationTime('10m')
          .sign(new TextEncoder().encode(JSON.stringify(jwk)));
        return `Bearer ${token}`;
      },
    ],
    [
      'an HS256 token keyed with the RSA modulus',
      'kubernetes',
      'acme-prod',
      401,
      async () => {
        const jwk = issuer.publicJwks.find((k) => k.kty === 'RSA')!;
        const head = b64({ alg: 'HS256', typ: 'JWT', kid: jwk.kid });
        const body = b64({ sub: CHECKOUT_SA, aud: 'token-broker', iss: issuer.issuer, exp: 4e9 });
        const sig = createHmac('sha256', String(jwk.n))
          .update(`${head}.${body}`)
          .digest('base64url');
        return `Bearer ${head}.${body}.${sig}`;
      },
    ],
    ['garbage', 'kubernetes', 'acme-prod', 401, async () => 'Bearer not.a.jwt'],
    [
      'a base64 blob',
      'kubernetes',
      'acme-prod',
      401,
      async () => `Bearer ${randomBytes(600).toString('base64')}`,
    ],
    [
      'an API key in kubernetes mode',
      'kubernetes',
      'acme-prod',
      401,
      async () => `Bearer ${checkoutKey}`,
    ],
    [
      'a token for another client',
      'kubernetes',
      'globex-prod',
      403,
      () => saToken({ subject: CHECKOUT_SA }),
    ],
    [
      'a verified service account with no grant',
      'kubernetes',
      'acme-prod',
      403,
      () => saToken({ subject: STRANGER_SA }),
    ],
  ];

  it.each(cases)(
    '%s (%s, client %s) → %i problem+json, never 500',
    async (_label, mode, client, status, make) => {
      const broker = mode === 'api-key' ? apiKeyBroker : k8sBroker;
      const authorization = await make();
      const res = await call(broker, `/token?client=${client}`, authorization);
      expect(res.status).toBe(status);
      expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(res.headers.get('cache-control')).toBe('no-store');
      expect(res.body.code).toBe(status === 401 ? 'unauthenticated' : 'forbidden');
      if (status === 401) {
        expect(res.headers.get('www-authenticate')).toBe('Bearer realm="token-broker"');
      } else {
        expect(res.headers.get('www-authenticate')).toBeNull();
        expect(res.body.detail).toMatch(/may not use client/);
      }
      const credential = authorization?.replace(/^\S+\s+/, '') ?? '';
      if (credential.length > 8)
        expect(JSON.stringify(res.body)).not.toContain(credential.slice(0, 40));
    },
  );

  describe('a caller cannot enumerate the clients outside its grant', () => {
    /** Status, code, body keys and detail (with the asked id masked) of one answer. */
    async function shape(res: Response, asked: string) {
      const text = await res.text();
      const body = JSON.parse(text) as Record<string, unknown>;
      return {
        status: res.status,
        contentType: res.headers.get('content-type'),
        keys: Object.keys(body).sort(),
        code: body.code ?? body.error,
        detail: String(body.detail ?? body.error_description).replaceAll(asked, '<id>'),
        length: text.length,
      };
    }

    const getToken = (b: StackBroker, client: string, authorization: string) =>
      fetch(`${b.url}/token?client=${client}`, { headers: { authorization } });
    const postOrder = (b: StackBroker, client: string, authorization: string) =>
      fetch(`${b.url}/orders?client=${client}`, {
        method: 'POST',
        headers: { authorization, 'content-type': 'application/json' },
        body: '{}',
      });
    const oauthToken = (b: StackBroker, client: string, key: string) =>
      fetch(`${b.url}/oauth2/token`, {
        method: 'POST',
        headers: {
          authorization: `Basic ${Buffer.from(`checkout:${key}`).toString('base64')}`,
          'content-type': 'application/x-www-form-urlencoded',
        },
        body: `grant_type=client_credentials&resource=${client}`,
      });

    it.each([
      ['GET /token', 403, 'forbidden'],
      ['POST /orders', 403, 'forbidden'],
      ['POST /oauth2/token', 400, 'unauthorized_client'],
    ] as const)(
      '%s: a configured client not granted and one that does not exist answer alike (%i %s)',
      async (route, status, code) => {
        const ask = async (client: string) => {
          const res =
            route === 'GET /token'
              ? await getToken(apiKeyBroker, client, `Bearer ${checkoutKey}`)
              : route === 'POST /orders'
                ? await postOrder(apiKeyBroker, client, `Bearer ${checkoutKey}`)
                : await oauthToken(apiKeyBroker, client, checkoutKey);
          return shape(res, client);
        };
        // Same length ids, so that not even the body length differs.
        const configured = await ask('globex-prod');
        const missing = await ask('zzzzzz-prod');
        expect(configured).toEqual(missing);
        expect(configured).toMatchObject({ status, code });
      },
    );

    it('answers the same in kubernetes mode, for a caller with and without a grant', async () => {
      for (const subject of [CHECKOUT_SA, STRANGER_SA]) {
        const header = await saToken({ subject });
        const configured = await shape(
          await getToken(k8sBroker, 'globex-prod', header),
          'globex-prod',
        );
        const missing = await shape(
          await getToken(k8sBroker, 'zzzzzz-prod', header),
          'zzzzzz-prod',
        );
        expect(configured).toEqual(missing);
        expect(configured).toMatchObject({ status: 403, code: 'forbidden' });
      }
    });

    it('a caller granted every client still learns that a client does not exist (404)', async () => {
      const res = await call(apiKeyBroker, '/token?client=zzzzzz-prod', `Bearer ${opsKey}`);
      expect(res.status).toBe(404);
      expect(res.body.code).toBe('unknown_client');
    });

    it('without ?client=, lists only the clients this caller may use', async () => {
      const checkout = await call(apiKeyBroker, '/token', `Bearer ${checkoutKey}`);
      expect(checkout.status).toBe(400);
      expect(checkout.body.code).toBe('client_required');
      expect(checkout.body.detail).toContain('acme-prod');
      expect(checkout.body.detail).not.toContain('globex');

      const ops = await call(apiKeyBroker, '/token', `Bearer ${opsKey}`);
      expect(ops.body.detail).toContain('acme-prod, globex-prod');

      const stranger = await call(k8sBroker, '/token', await saToken({ subject: STRANGER_SA }));
      expect(stranger.status).toBe(400);
      expect(stranger.body.detail).toMatch(/may use none of them/);
      expect(stranger.body.detail).not.toMatch(/acme|globex/);
    });

    it('the audit line still says which it was', async () => {
      const missing = await getToken(apiKeyBroker, 'zzzzzz-prod', `Bearer ${checkoutKey}`);
      const configured = await getToken(apiKeyBroker, 'globex-prod', `Bearer ${checkoutKey}`);
      const line = (res: Response) =>
        waitFor(
          () =>
            apiKeyBroker
              .logs()
              .map((l) => (l.startsWith('{') ? (JSON.parse(l) as Record<string, unknown>) : {}))
              .find((l) => l.reqId === res.headers.get('x-request-id')),
          { timeoutMs: 5000, what: 'the audit line' },
        );
      expect(await line(missing)).toMatchObject({ result: 'forbidden', reason: 'unknown_client' });
      const configuredLine = await line(configured);
      expect(configuredLine).toMatchObject({ result: 'forbidden', client: 'globex-prod' });
      expect(configuredLine.reason).toBeUndefined();
    });
  });

  describe('a proxy-only caller (scope "forward")', () => {
    const proxyAuth = () => `Bearer ${set.keys.proxy}`;

    it('is refused the token on GET /token, naming the scope, and the refusal is audited', async () => {
      const res = await fetch(`${apiKeyBroker.url}/token?client=acme-prod`, {
        headers: { authorization: proxyAuth() },
      });
      const body = (await res.json()) as Answer['body'] & { code?: string; detail?: string };
      expect(res.status).toBe(403);
      expect(body.code).toBe('forbidden');
      expect(body.detail).toContain('scope "token"');
      expect(body.access_token).toBeUndefined();
      const line = await waitFor(
        () =>
          apiKeyBroker
            .logs()
            .map((l) => (l.startsWith('{') ? (JSON.parse(l) as Record<string, unknown>) : {}))
            .find((l) => l.reqId === res.headers.get('x-request-id')),
        { timeoutMs: 5000, what: 'the audit line' },
      );
      expect(line).toMatchObject({
        caller: 'proxy',
        result: 'forbidden',
        reason: 'missing_scope_token',
      });
    });

    it('is refused the token on POST /oauth2/token too', async () => {
      const res = await fetch(`${apiKeyBroker.url}/oauth2/token`, {
        method: 'POST',
        headers: {
          authorization: `Basic ${Buffer.from(`proxy:${set.keys.proxy}`).toString('base64')}`,
          'content-type': 'application/x-www-form-urlencoded',
        },
        body: 'grant_type=client_credentials&resource=acme-prod',
      });
      const body = (await res.json()) as Record<string, unknown>;
      expect(res.status).toBe(400);
      expect(body).toMatchObject({ error: 'unauthorized_client' });
      expect(String(body.error_description)).toContain('scope "token"');
      expect(body.access_token).toBeUndefined();
    });

    it('has its orders forwarded with the token it never sees', async () => {
      const res = await fetch(`${apiKeyBroker.url}/orders?client=acme-prod`, {
        method: 'POST',
        headers: { authorization: proxyAuth(), 'content-type': 'application/json' },
        body: JSON.stringify({ price: 50_000, orderRef: 'proxy-only-1' }),
      });
      const text = await res.text();
      expect(res.status).toBe(201);
      expect(text).not.toMatch(/access_token|Bearer/i);
    });

    it('has provider calls forwarded through /provider/<client>/... without ever seeing the token', async () => {
      const res = await fetch(
        `${apiKeyBroker.url}/provider/acme-prod/api/marketing/v1/large?bytes=16`,
        { headers: { authorization: proxyAuth() } },
      );
      const text = await res.text();
      expect(res.status).toBe(200);
      expect(text).toBe('x'.repeat(16));
      expect([...res.headers.keys()].join(' ')).not.toMatch(/authorization|set-cookie/i);
    });

    it('a caller without "forward" is refused the passthrough the same for any client', async () => {
      const call = async (client: string) => {
        const res = await fetch(`${apiKeyBroker.url}/provider/${client}/api/marketing/v1/offers`, {
          headers: { authorization: `Bearer ${set.keys.reader}` },
        });
        const body = (await res.json()) as Record<string, unknown>;
        delete body.requestId;
        return { status: res.status, body };
      };
      const granted = await call('acme-prod');
      expect(granted.status).toBe(403);
      expect(String(granted.body.detail)).toContain('scope "forward"');
      expect(await call('zzzzzz-prod')).toEqual(granted);
      // Nothing of the path is looked at first: a path trick gets the same refusal.
      expect(await call('acme-prod/api/marketing/v1/%2e%2e/x/')).toEqual(granted);
    });

    it('checks the caller before the path: 401 for a path trick without a credential', async () => {
      const res = await fetch(
        `${apiKeyBroker.url}/provider/acme-prod/api/marketing/v1/%2e%2e/%2e%2e/auth/v1/oauth/token`,
      );
      expect(res.status).toBe(401);
      expect(((await res.json()) as { code: string }).code).toBe('unauthenticated');
    });

    it('a caller without "forward" is refused orders, before its client is looked at', async () => {
      const post = async (client: string) => {
        const res = await fetch(`${apiKeyBroker.url}/orders?client=${client}`, {
          method: 'POST',
          headers: {
            authorization: `Bearer ${set.keys.reader}`,
            'content-type': 'application/json',
          },
          body: JSON.stringify({ price: 50_000, orderRef: 'reader-1' }),
        });
        const body = (await res.json()) as Record<string, unknown>;
        delete body.requestId;
        return { status: res.status, body };
      };
      const granted = await post('acme-prod');
      expect(granted.status).toBe(403);
      expect(granted.body.code).toBe('forbidden');
      expect(String(granted.body.detail)).toContain('scope "forward"');
      // The same answer for a client that does not exist: nothing learnt about clients.
      expect(await post('zzzzzz-prod')).toEqual(granted);
      // It still reads the token it was granted.
      const token = await fetch(`${apiKeyBroker.url}/token?client=acme-prod`, {
        headers: { authorization: `Bearer ${set.keys.reader}` },
      });
      expect(token.status).toBe(200);
    });
  });

  it('sets the security headers on tokens, problems and health alike', async () => {
    const answers = [
      await fetch(`${apiKeyBroker.url}/token?client=acme-prod`, {
        headers: { authorization: `Bearer ${checkoutKey}` },
      }),
      await fetch(`${apiKeyBroker.url}/token`),
      await fetch(`${k8sBroker.url}/health/live`),
      await fetch(`${k8sBroker.url}/nothing-here`),
    ];
    for (const res of answers) {
      expect(res.headers.get('x-content-type-options')).toBe('nosniff');
      expect(res.headers.get('x-frame-options')).toBe('DENY');
      expect(res.headers.get('content-security-policy')).toContain("default-src 'none'");
      expect(res.headers.get('referrer-policy')).toBe('no-referrer');
      const body = await res.text();
      if (body.includes('access_token')) {
        secretsSeen.add((JSON.parse(body) as { access_token: string }).access_token);
      }
    }
  });

  it('audits every token handed out (one line per caller, client and token per interval) and every refusal', async () => {
    const res = await call(apiKeyBroker, '/token?client=acme-prod', `Bearer ${checkoutKey}`);
    const fp = createHash('sha256').update(res.body.access_token!).digest('hex').slice(0, 16);
    const requestId = res.headers.get('x-request-id');
    const auditLines = () =>
      apiKeyBroker
        .logs()
        .filter((l) => l.includes('"audit":"token"'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    // Written on the broker's audit interval (1 s here): wait for the line rather than race it.
    const line = await waitFor(
      () =>
        auditLines().find(
          (l) =>
            l.msg === 'token issued' &&
            l.caller === 'checkout' &&
            l.fp === fp &&
            Date.parse(l.last as string) >= Date.parse(res.headers.get('date')!) - 1000,
        ),
      { timeoutMs: 5000, what: 'the audit line of the request' },
    );
    const lines = auditLines();
    expect(line).toMatchObject({
      level: 'info',
      msg: 'token issued',
      caller: 'checkout',
      client: 'acme-prod',
      fp,
      result: 'issued',
      count: expect.any(Number) as number,
      reqIds: expect.any(Array) as string[],
    });
    expect(line.count).toBeGreaterThanOrEqual(1);
    expect(Date.parse(line.first as string)).toBeLessThanOrEqual(Date.parse(line.last as string));
    expect(requestId).toMatch(/./);
    expect((line.reqIds as string[]).length).toBeGreaterThanOrEqual(1);
    expect(line).not.toHaveProperty('reqId');
    expect(lines).toContainEqual(
      expect.objectContaining({ caller: 'checkout', client: 'globex-prod', result: 'forbidden' }),
    );
    expect(lines).toContainEqual(
      expect.objectContaining({ msg: 'token refused', result: 'unauthenticated' }),
    );
    // The kubernetes broker's lines are flushed on its own 200 ms timer: wait for them too.
    const k8sLine = await waitFor(
      () =>
        k8sBroker
          .logs()
          .find((l) => l.includes('"audit":"token"') && l.includes(`"caller":"${CHECKOUT_SA}"`)),
      { timeoutMs: 5000, what: "the kubernetes caller's audit line" },
    );
    expect(JSON.parse(k8sLine)).toMatchObject({ caller: CHECKOUT_SA, audit: 'token' });
  });

  // Last: every test above has logged by now.
  it('never logs an issued token, a client secret, an API key or a service-account token', () => {
    for (const t of provider.stats.issued) secretsSeen.add(t.token);
    const logs = [...apiKeyBroker.logs(), ...k8sBroker.logs()].join('\n');
    expect(logs).toContain('"level":"debug"');
    expect(logs.length).toBeGreaterThan(1000);
    const leaked = [...secretsSeen].filter((s) => s.length >= 8 && logs.includes(s));
    expect(leaked).toEqual([]);
  });
});
