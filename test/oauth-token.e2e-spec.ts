import { execFile } from 'node:child_process';
import { get } from 'node:http';
import { promisify } from 'node:util';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import type { ServiceAccountIssuer } from '../emulator/service-account-issuer';
import type { BrokerProcess } from './support/broker-process';
import {
  type CallerBrokers,
  CHECKOUT_SA,
  JWT_BEARER,
  newKey,
  OPS_SA,
  sha256,
  startCallerBrokers,
} from './support/caller-brokers';
import { startStack } from './support/stack';
import { waitFor } from './support/wait';

const basic = (id: string, secret: string) =>
  `Basic ${Buffer.from(`${encodeURIComponent(id)}:${encodeURIComponent(secret)}`).toString('base64')}`;

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  body: {
    access_token?: string;
    token_type?: string;
    expires_in?: number;
    error?: string;
    error_description?: string;
  };
}

/**
 * `POST /oauth2/token` and the RFC 8414 metadata against real broker processes
 * (`node dist/main.js`, run `npm run build` first): one in caller-auth mode `api-key`
 * (client_secret_basic / client_secret_post), one in mode `kubernetes` (RFC 7523 client
 * assertion). Both also configure a client whose credentials the provider refuses, for
 * `temporarily_unavailable`, so readiness is polled on the working clients, not /health/ready.
 */
jest.setTimeout(60_000);

describe('POST /oauth2/token (real brokers)', () => {
  let checkoutKey: string;
  let opsKey: string;
  let set: CallerBrokers;
  let provider: ProviderEmulator;
  let issuer: ServiceAccountIssuer;
  let apiKeyBroker: BrokerProcess;
  let k8sBroker: BrokerProcess;

  async function post(
    broker: BrokerProcess,
    form: Record<string, string | string[]> | string,
    headers: Record<string, string> = {},
  ): Promise<Answer> {
    const params = new URLSearchParams();
    if (typeof form !== 'string') {
      for (const [k, v] of Object.entries(form)) {
        for (const one of Array.isArray(v) ? v : [v]) params.append(k, one);
      }
    }
    const res = await fetch(`${broker.url}/oauth2/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
      body: typeof form === 'string' ? form : params.toString(),
    });
    const text = await res.text();
    return {
      status: res.status,
      headers: res.headers,
      text,
      body: JSON.parse(text) as Answer['body'],
    };
  }

  const grant = { grant_type: 'client_credentials' };

  beforeAll(async () => {
    set = await startCallerBrokers({ name: 'oauth', kubernetes: true });
    ({ provider, issuer, apiKeyBroker } = set);
    k8sBroker = set.k8sBroker!;
    ({ checkout: checkoutKey, ops: opsKey } = set.keys);
  });

  afterAll(async () => {
    await set?.stop();
  });

  function expectTokenAnswer(res: Answer): void {
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.headers.get('pragma')).toBe('no-cache');
    expect(res.body.token_type).toBe('Bearer');
    expect(provider.isValidToken(res.body.access_token!)).toBe(true);
    expect(res.body.expires_in).toBeGreaterThan(0);
    expect(Number.isInteger(res.body.expires_in)).toBe(true);
  }

  function expectError(res: Answer, status: number, error: string): void {
    expect({ status: res.status, error: res.body.error }).toEqual({ status, error });
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(typeof res.body.error_description).toBe('string');
  }

  describe('success', () => {
    it('client_secret_basic: the caller only granted one client gets it, the same token as GET /token', async () => {
      const res = await post(apiKeyBroker, grant, {
        authorization: basic('checkout', checkoutKey),
      });
      expectTokenAnswer(res);
      const viaGet = (await (
        await fetch(`${apiKeyBroker.url}/token?client=acme-prod`, {
          headers: { authorization: `Bearer ${checkoutKey}` },
        })
      ).json()) as { access_token: string };
      expect(res.body.access_token).toBe(viaGet.access_token);
    });

    it('client_secret_post with resource, audience or scope naming the client', async () => {
      const globex = (
        (await (
          await fetch(`${apiKeyBroker.url}/token?client=globex-prod`, {
            headers: { authorization: `Bearer ${opsKey}` },
          })
        ).json()) as { access_token: string }
      ).access_token;
      for (const param of ['resource', 'audience', 'scope']) {
        const res = await post(apiKeyBroker, {
          ...grant,
          client_id: 'ops',
          client_secret: opsKey,
          [param]: 'globex-prod',
        });
        expectTokenAnswer(res);
        expect(res.body.access_token).toBe(globex);
      }
    });

    it('serves from L1: many requests, no provider token request', async () => {
      // Tokens issued, not requests: a client whose secret the provider refuses (another test)
      // keeps probing the provider in the background, and those requests issue nothing.
      const before = provider.stats.tokensIssued;
      const answers = await Promise.all(
        Array.from({ length: 30 }, () =>
          post(
            apiKeyBroker,
            { ...grant, resource: 'acme-prod' },
            {
              authorization: basic('ops', opsKey),
            },
          ),
        ),
      );
      expect(answers.map((a) => a.status)).toEqual(Array(30).fill(200));
      expect(provider.stats.tokensIssued).toBe(before);
    });

    it('RFC 7523 client assertion: a service-account token, verified like a Bearer one', async () => {
      const assertion = await issuer.token({ subject: CHECKOUT_SA, audience: 'token-broker' });
      const res = await post(k8sBroker, {
        ...grant,
        client_assertion_type: JWT_BEARER,
        client_assertion: assertion,
      });
      expectTokenAnswer(res);
      const withId = await post(k8sBroker, {
        ...grant,
        client_id: CHECKOUT_SA,
        client_assertion_type: JWT_BEARER,
        client_assertion: assertion,
        resource: 'acme-prod',
      });
      expectTokenAnswer(withId);
    });

    it('works with curl as the README shows', async () => {
      const { stdout } = await promisify(execFile)('curl', [
        '-sS',
        '-u',
        `checkout:${checkoutKey}`,
        '-d',
        'grant_type=client_credentials',
        '-d',
        'resource=acme-prod',
        `${apiKeyBroker.url}/oauth2/token`,
      ]);
      const body = JSON.parse(stdout) as Answer['body'];
      expect(body.token_type).toBe('Bearer');
      expect(provider.isValidToken(body.access_token!)).toBe(true);
    });

    it('writes the same audit line as GET /token', async () => {
      const res = await post(apiKeyBroker, grant, {
        authorization: basic('checkout', checkoutKey),
      });
      const sentAt = Date.parse(res.headers.get('date')!) - 1000;
      const fp = sha256(res.body.access_token!).slice(0, 16);
      // The aggregate line (one per caller, client and token per interval) counting it.
      const line = await waitFor(
        () =>
          apiKeyBroker
            .logs()
            .filter((l) => l.includes('"audit":"token"'))
            .map((l) => JSON.parse(l) as Record<string, unknown>)
            .find(
              (l) =>
                l.msg === 'token issued' &&
                l.caller === 'checkout' &&
                l.fp === fp &&
                Date.parse(l.last as string) >= sentAt,
            ),
        { timeoutMs: 5000, what: 'the audit line of the request' },
      );
      expect(line).toMatchObject({
        msg: 'token issued',
        caller: 'checkout',
        client: 'acme-prod',
        fp,
        result: 'issued',
      });
    });
  });

  describe('errors (RFC 6749 §5.2)', () => {
    it('invalid_client: 401 with a Basic challenge when Basic was used or nothing was sent', async () => {
      for (const authorization of [
        basic('checkout', newKey()),
        basic('ops', checkoutKey), // a real key, named as another caller
        'Basic !!!',
        'Basic ' + Buffer.from('no-colon').toString('base64'),
      ]) {
        const res = await post(apiKeyBroker, grant, { authorization });
        expectError(res, 401, 'invalid_client');
        expect(res.headers.get('www-authenticate')).toMatch(/^Basic realm="token-broker"/);
      }
      const none = await post(apiKeyBroker, grant);
      expectError(none, 401, 'invalid_client');
      expect(none.headers.get('www-authenticate')).toMatch(/^Basic /);
    });

    it('invalid_client: 400 without a challenge for a bad client_secret_post or assertion', async () => {
      const wrong = await post(apiKeyBroker, {
        ...grant,
        client_id: 'checkout',
        client_secret: newKey(),
      });
      expectError(wrong, 400, 'invalid_client');
      expect(wrong.headers.get('www-authenticate')).toBeNull();
      const bearer = await post(apiKeyBroker, grant, { authorization: `Bearer ${checkoutKey}` });
      expectError(bearer, 400, 'invalid_client');
      const assertionInApiKeyMode = await post(apiKeyBroker, {
        ...grant,
        client_assertion_type: JWT_BEARER,
        client_assertion: await issuer.token({ subject: CHECKOUT_SA }),
      });
      expectError(assertionInApiKeyMode, 400, 'invalid_client');
      for (const assertion of [
        await issuer.token({ subject: CHECKOUT_SA, unpublishedKey: true }),
        await issuer.token({ subject: CHECKOUT_SA, expiresInSeconds: -600 }),
        'not.a.jwt',
      ]) {
        const res = await post(k8sBroker, {
          ...grant,
          client_assertion_type: JWT_BEARER,
          client_assertion: assertion,
        });
        expectError(res, 400, 'invalid_client');
      }
      const otherId = await post(k8sBroker, {
        ...grant,
        client_id: OPS_SA,
        client_assertion_type: JWT_BEARER,
        client_assertion: await issuer.token({ subject: CHECKOUT_SA }),
      });
      expectError(otherId, 400, 'invalid_client');
      const basicInK8s = await post(k8sBroker, grant, {
        authorization: basic('checkout', checkoutKey),
      });
      expectError(basicInK8s, 401, 'invalid_client');
    });

    it('unauthorized_client: a caller asking for a client it is not granted', async () => {
      const res = await post(
        apiKeyBroker,
        { ...grant, resource: 'globex-prod' },
        {
          authorization: basic('checkout', checkoutKey),
        },
      );
      expectError(res, 400, 'unauthorized_client');
      const k8s = await post(k8sBroker, {
        ...grant,
        resource: 'globex-prod',
        client_assertion_type: JWT_BEARER,
        client_assertion: await issuer.token({ subject: CHECKOUT_SA }),
      });
      expectError(k8s, 400, 'unauthorized_client');
    });

    it('unsupported_grant_type, invalid_target, invalid_scope', async () => {
      const auth = { authorization: basic('ops', opsKey) };
      expectError(
        await post(apiKeyBroker, { grant_type: 'password', username: 'a', password: 'b' }, auth),
        400,
        'unsupported_grant_type',
      );
      expectError(
        await post(apiKeyBroker, { ...grant, resource: 'nope-prod' }, auth),
        400,
        'invalid_target',
      );
      expectError(
        await post(apiKeyBroker, { ...grant, audience: 'nope-prod' }, auth),
        400,
        'invalid_target',
      );
      expectError(
        await post(apiKeyBroker, { ...grant, scope: 'nope-prod' }, auth),
        400,
        'invalid_scope',
      );
      expectError(
        await post(apiKeyBroker, { ...grant, scope: 'acme-prod globex-prod' }, auth),
        400,
        'invalid_scope',
      );
    });

    it('temporarily_unavailable: 503 with Retry-After when no token can be had', async () => {
      const res = await post(
        apiKeyBroker,
        { ...grant, resource: 'initech-prod' },
        {
          authorization: basic('ops', opsKey),
        },
      );
      expectError(res, 503, 'temporarily_unavailable');
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
    });
  });

  describe('bad input: the RFC error, never a 500, never an echo of a secret', () => {
    const auth = () => ({ authorization: basic('ops', opsKey) });
    type Case = [string, () => Promise<Answer>, number, string];
    const cases: Case[] = [
      [
        'no grant_type',
        () => post(apiKeyBroker, { resource: 'acme-prod' }, auth()),
        400,
        'invalid_request',
      ],
      [
        'grant_type twice',
        () =>
          post(apiKeyBroker, { grant_type: ['client_credentials', 'client_credentials'] }, auth()),
        400,
        'invalid_request',
      ],
      [
        'resource twice',
        () => post(apiKeyBroker, { ...grant, resource: ['acme-prod', 'globex-prod'] }, auth()),
        400,
        'invalid_request',
      ],
      [
        'resource and scope naming different clients',
        () => post(apiKeyBroker, { ...grant, resource: 'acme-prod', scope: 'globex-prod' }, auth()),
        400,
        'invalid_request',
      ],
      [
        'several clients possible and none named',
        () => post(apiKeyBroker, grant, auth()),
        400,
        'invalid_request',
      ],
      [
        'Basic and client_secret_post together',
        () => post(apiKeyBroker, { ...grant, client_id: 'ops', client_secret: opsKey }, auth()),
        400,
        'invalid_request',
      ],
      [
        'an empty Basic secret',
        () => post(apiKeyBroker, grant, { authorization: basic('checkout', '') }),
        401,
        'invalid_client',
      ],
      [
        'client_secret_post without client_id',
        () => post(apiKeyBroker, { ...grant, client_secret: opsKey }),
        400,
        'invalid_request',
      ],
      [
        'a wrong client_assertion_type',
        () =>
          post(k8sBroker, {
            ...grant,
            client_assertion_type: 'urn:example:saml',
            client_assertion: 'x',
          }),
        400,
        'invalid_request',
      ],
      [
        'a JSON body',
        () =>
          post(apiKeyBroker, JSON.stringify({ ...grant, client_secret: opsKey }), {
            ...auth(),
            'content-type': 'application/json',
          }),
        400,
        'invalid_request',
      ],
      [
        'no body at all',
        async () => {
          const res = await fetch(`${apiKeyBroker.url}/oauth2/token`, {
            method: 'POST',
            headers: auth(),
          });
          const text = await res.text();
          return { status: res.status, headers: res.headers, text, body: JSON.parse(text) };
        },
        400,
        'invalid_request',
      ],
      [
        'an oversized body',
        () =>
          post(apiKeyBroker, {
            ...grant,
            client_id: 'ops',
            client_secret: opsKey,
            pad: 'x'.repeat(64_000),
          }),
        400,
        'invalid_request',
      ],
      [
        'malformed percent-encoding around a secret',
        () =>
          post(
            apiKeyBroker,
            `grant_type=client_credentials&client_id=ops&client_secret=${opsKey}%ZZ`,
          ),
        400,
        'invalid_client',
      ],
    ];

    it.each(cases)('%s', async (_name, send, status, error) => {
      const res = await send();
      expectError(res, status, error);
      expect(res.text).not.toContain(opsKey);
      expect(res.text).not.toContain(checkoutKey);
    });
  });

  describe('RFC 8414 metadata', () => {
    it('api-key mode: the endpoint from the Host the caller used, basic and post', async () => {
      const res = await fetch(`${apiKeyBroker.url}/.well-known/oauth-authorization-server`);
      expect(res.status).toBe(200);
      const doc = (await res.json()) as Record<string, unknown>;
      expect(doc).toMatchObject({
        issuer: apiKeyBroker.url,
        token_endpoint: `${apiKeyBroker.url}/oauth2/token`,
        grant_types_supported: ['client_credentials'],
        token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post'],
      });
      expect(doc).not.toHaveProperty('token_endpoint_auth_signing_alg_values_supported');
    });

    it('is never cached and does not list the configured clients', async () => {
      const res = await fetch(`${apiKeyBroker.url}/.well-known/oauth-authorization-server`);
      // Built from the Host header unless OAUTH_ISSUER is set: a shared cache must not keep it.
      expect(res.headers.get('cache-control')).toBe('no-store');
      expect(await res.json()).not.toHaveProperty('scopes_supported');
    });

    it('warns at start-up in production without OAUTH_ISSUER, naming the setting, and not with it', async () => {
      const stack = await startStack({
        name: 'oauth-issuer',
        clients: ['acme-prod'],
        callerAuth: { mode: 'api-key', callers: { checkout: { clients: ['acme-prod'] } } },
        inProcess: true,
        replicas: 0,
      });
      try {
        const warnings = async (env: Record<string, string | undefined>) => {
          const broker = await stack.addBroker({ env });
          await broker.stop();
          return broker
            .logs()
            .map((l) => JSON.parse(l) as { level: string; setting?: string; msg: string })
            .filter((l) => l.setting === 'OAUTH_ISSUER');
        };
        const unset = await warnings({ NODE_ENV: 'production' });
        expect(unset).toEqual([
          expect.objectContaining({
            level: 'warn',
            msg: expect.stringMatching(/^OAUTH_ISSUER \(http\.issuer\) is not set: /),
          }),
        ]);
        expect(
          await warnings({ NODE_ENV: 'production', OAUTH_ISSUER: 'http://token-broker.shop.svc' }),
        ).toEqual([]);
        // The sandbox and the tests: the Host-derived document is the point there.
        expect(await warnings({ NODE_ENV: 'development' })).toEqual([]);
      } finally {
        await stack.close();
      }
    });

    it('kubernetes mode: no method advertised (a service-account token is no private_key_jwt)', async () => {
      // fetch() sets Host itself; node:http sends the one a cluster DNS name would give.
      const doc = await new Promise<Record<string, unknown>>((resolve, reject) => {
        get(
          `${k8sBroker.url}/.well-known/oauth-authorization-server`,
          { headers: { host: 'token-broker.shop.svc' } },
          (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (chunk: string) => (text += chunk));
            res.on('end', () => resolve(JSON.parse(text) as Record<string, unknown>));
          },
        ).on('error', reject);
      });
      expect(doc).toMatchObject({
        issuer: 'http://token-broker.shop.svc',
        token_endpoint: 'http://token-broker.shop.svc/oauth2/token',
        // An empty list: an absent one would mean client_secret_basic (RFC 8414 §2).
        token_endpoint_auth_methods_supported: [],
      });
      expect(doc).not.toHaveProperty('token_endpoint_auth_signing_alg_values_supported');
    });
  });
});
