import { createHash, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type AuthServer, introspect, startAuthServer } from './support/auth-server';
import { type Stack, type StackClient, type StackCredentials, startStack } from './support/stack';
import { requestsPerCycle } from './support/fleet';
import { freePort } from './support/ports';
import { hammer } from './support/load';
import { makeTestCertificates, type TestCertificates } from './support/test-certificates';
import { waitFor } from './support/wait';

const INTROSPECTOR = { id: 'introspector', secret: 'introspector-secret-0123456789abcdef' };

/** RFC 8705 §3.1: the SHA-256 thumbprint of the DER certificate, base64url. */
const thumbprint = (der: Buffer) => createHash('sha256').update(der).digest('base64url');

/** The public JWK of a certificate's key, with the certificate as `x5c`. */
function certificateJwk(file: string): Record<string, unknown> {
  const cert = new X509Certificate(readFileSync(file));
  return { ...cert.publicKey.export({ format: 'jwk' }), x5c: [cert.raw.toString('base64')] };
}

/** What the resource server saw of one call. */
interface Seen {
  path: string;
  certificate?: string;
  verdict: 'accepted' | 'unbound' | 'mismatch' | 'inactive' | 'no_certificate';
}

/**
 * Certificate-bound access tokens (RFC 8705 §3) against oidc-provider with
 * `features.mTLS.certificateBoundAccessTokens`: the broker configures the client from the issuer
 * alone (RFC 8414 metadata, its `mtls_endpoint_aliases` token endpoint: the issuer's own
 * listener asks for no certificate), trusts the test CA through the client's `caFile` only (no
 * NODE_EXTRA_CA_CERTS), and presents the certificate to the API as well, where a resource server
 * of this test accepts a token only when its `cnf.x5t#S256` (read by introspection) is the
 * thumbprint of the certificate presented on that very connection.
 */
describe('certificate-bound tokens against oidc-provider', () => {
  let dir: string;
  let certs: TestCertificates;
  let as: AuthServer;
  let api: Server;
  let apiUrl: string;
  let stack: Stack;
  const seen: Seen[] = [];
  /** The server the resource server asks about tokens, when not the suite's own. */
  let introspectAt: AuthServer | undefined;

  const pair = (cert: string, key: string): StackCredentials => ({
    client_id: 'shop-bound',
    certificate: readFileSync(cert, 'utf8'),
    private_key: readFileSync(key, 'utf8'),
  });
  const bound = (
    id: string,
    credentials: StackCredentials,
    config: Record<string, unknown> = {},
  ): StackClient => ({
    id,
    credentials,
    config: {
      baseUrl: apiUrl,
      caFile: certs.ca,
      tokenRequest: { grant: 'rfc6749', issuer: as.url, auth: 'tls_client_auth' },
      ...config,
    },
  });

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'tb-bound-'));
    certs = makeTestCertificates(dir);
    as = await startAuthServer({
      tls: { key: certs.serverKey, cert: certs.serverCert, clientCa: certs.ca },
      certificateBoundAccessTokens: true,
      mtlsAlias: true,
      // No private_key_jwt: a client configured with it is refused from the metadata.
      clientAuthMethods: ['client_secret_basic', 'tls_client_auth', 'self_signed_tls_client_auth'],
      clients: [
        {
          // RFC 8705 §2.2: the server holds the certificate itself (its key, with x5c).
          client_id: 'shop-self-signed',
          token_endpoint_auth_method: 'self_signed_tls_client_auth',
          tls_client_certificate_bound_access_tokens: true,
          jwks: { keys: [certificateJwk(certs.otherCert)] },
        },
        {
          client_id: 'shop-bound',
          token_endpoint_auth_method: 'tls_client_auth',
          tls_client_auth_subject_dn: certs.clientSubject,
          tls_client_certificate_bound_access_tokens: true,
        },
        {
          client_id: INTROSPECTOR.id,
          client_secret: INTROSPECTOR.secret,
          token_endpoint_auth_method: 'client_secret_basic',
        },
      ],
    });
    api = createServer(
      {
        key: readFileSync(certs.serverKey),
        cert: readFileSync(certs.serverCert),
        ca: readFileSync(certs.ca),
        requestCert: true,
        rejectUnauthorized: false,
      },
      (req, res) => {
        void (async () => {
          const socket = req.socket as TLSSocket;
          const peer = socket.getPeerCertificate();
          const token = (req.headers.authorization ?? '').replace(/^Bearer /, '');
          const path = req.url ?? '';
          const record = (verdict: Seen['verdict']) =>
            seen.push({ path, certificate: peer?.subject?.CN, verdict });
          if (path.startsWith('/api/marketing/v1/echo') || path.startsWith('/api/echo/')) {
            // A provider that echoes the Authorization header it was sent.
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ youSent: req.headers.authorization }));
            return;
          }
          const refuse = (verdict: Seen['verdict']) => {
            record(verdict);
            res.writeHead(401, { 'www-authenticate': 'Bearer error="invalid_token"' });
            res.end();
          };
          if (!peer?.raw) return refuse('no_certificate');
          const info = await introspect(introspectAt ?? as, token, INTROSPECTOR, certs.ca);
          if (info.active !== true) return refuse('inactive');
          const cnf = (info.cnf as Record<string, string> | undefined)?.['x5t#S256'];
          if (cnf === undefined) return refuse('unbound');
          if (cnf !== thumbprint(new X509Certificate(peer.raw).raw)) return refuse('mismatch');
          record('accepted');
          res.writeHead(req.method === 'POST' ? 201 : 200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ client: info.client_id, cnf }));
        })();
      },
    );
    await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve));
    apiUrl = `https://127.0.0.1:${(api.address() as AddressInfo).port}`;
    stack = await startStack({
      name: 'broker-bound',
      inProcess: true,
      clients: [
        bound('bound', pair(certs.clientCert, certs.clientKey)),
        // Its orders go to a path where the provider echoes the Authorization header.
        bound('echoing', pair(certs.clientCert, certs.clientKey), {
          ordersPath: '/api/echo/v1/orders',
        }),
        // Its issuer answers nothing: its failure, no other client's.
        {
          ...bound('no-metadata', pair(certs.clientCert, certs.clientKey), {
            tokenRequest: {
              grant: 'rfc6749',
              issuer: `https://127.0.0.1:${await freePort()}`,
              auth: 'tls_client_auth',
            },
          }),
          refused: true,
        },
        bound(
          'self-signed',
          {
            client_id: 'shop-self-signed',
            certificate: readFileSync(certs.otherCert, 'utf8'),
            private_key: readFileSync(certs.otherKey, 'utf8'),
          },
          {
            tokenRequest: { grant: 'rfc6749', issuer: as.url, auth: 'self_signed_tls_client_auth' },
          },
        ),
      ],
      env: { LOG_LEVEL: 'warn' },
    });
  });

  afterAll(async () => {
    await stack?.close();
    api?.closeAllConnections();
    await new Promise((resolve) => api?.close(resolve));
    await as?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('configures the client from the issuer alone and gets a token bound to its certificate', async () => {
    const res = await fetch(`${stack.broker.url}/token?client=bound`);
    expect(res.status).toBe(200);
    const { access_token } = (await res.json()) as { access_token: string };
    const info = await introspect(as, access_token, INTROSPECTOR, certs.ca);
    expect(info).toMatchObject({ active: true, client_id: 'shop-bound' });
    const der = new X509Certificate(readFileSync(certs.clientCert)).raw;
    expect(info.cnf).toEqual({ 'x5t#S256': thumbprint(der) });
    // Through the mTLS alias: the issuer's own listener asks for no certificate.
    expect(
      as
        .grants()
        .map((g) => [g.event, g.client, g.certificate])
        .sort(),
    ).toEqual([
      ['grant', 'shop-bound', 'broker-client'],
      ['grant', 'shop-bound', 'broker-client'],
      ['grant', 'shop-self-signed', 'another-client'],
    ]);
  });

  it("presents the certificate on the passthrough, where the resource server checks the token's cnf", async () => {
    seen.length = 0;
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${stack.broker.url}/provider/bound/api/marketing/v1/offers`);
      expect([res.status, await res.json()]).toEqual([
        200,
        { client: 'shop-bound', cnf: expect.any(String) },
      ]);
    }
    expect(seen).toEqual(
      Array(3).fill({
        path: '/api/marketing/v1/offers',
        certificate: 'broker-client',
        verdict: 'accepted',
      }),
    );
  });

  it('self_signed_tls_client_auth: the same, with the certificate the server holds itself', async () => {
    seen.length = 0;
    const res = await fetch(`${stack.broker.url}/provider/self-signed/api/marketing/v1/offers`);
    expect([res.status, await res.json()]).toEqual([
      200,
      { client: 'shop-self-signed', cnf: expect.any(String) },
    ]);
    expect(seen).toEqual([
      { path: '/api/marketing/v1/offers', certificate: 'another-client', verdict: 'accepted' },
    ]);
  });

  it("is one client's failure when its metadata cannot be read: the others are served", async () => {
    const res = await fetch(`${stack.broker.url}/token?client=no-metadata`);
    const body = (await res.json()) as { code: string; detail: string };
    expect(res.status).toBe(503);
    expect(body.code).toBe('token_unavailable');
    expect(body.detail).toMatch(
      /metadata of tokenRequest.issuer "https:\/\/127.0.0.1:\d+" for client "no-metadata": cannot connect to the provider \(ECONNREFUSED\)/,
    );
    expect((await fetch(`${stack.broker.url}/token?client=bound`)).status).toBe(200);
    expect((await fetch(`${stack.broker.url}/health/ready`)).status).toBe(200);
  });

  it('presents the certificate on POST /orders too', async () => {
    seen.length = 0;
    const res = await fetch(`${stack.broker.url}/orders?client=bound`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"amount":100}',
    });
    expect([res.status, await res.json()]).toEqual([
      201,
      { client: 'shop-bound', cnf: expect.any(String) },
    ]);
    expect(seen).toEqual([
      { path: '/api/checkout/v1/orders', certificate: 'broker-client', verdict: 'accepted' },
    ]);
  });

  it('withholds an order answer that echoes the bound token: 502, never the token', async () => {
    const res = await fetch(`${stack.broker.url}/orders?client=echoing`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"amount":100}',
    });
    const text = await res.text();
    expect(res.status).toBe(502);
    expect(JSON.parse(text)).toMatchObject({ code: 'order_upstream_echoed_token' });
    expect(text).not.toMatch(/Bearer/);
  });

  it('withholds an answer that echoes the bound token: the caller gets 502, never the token', async () => {
    const res = await fetch(`${stack.broker.url}/provider/bound/api/marketing/v1/echo`);
    const text = await res.text();
    expect(res.status).toBe(502);
    expect(JSON.parse(text)).toMatchObject({ code: 'forward_upstream_echoed_token' });
    expect(text).not.toMatch(/Bearer/);
  });

  describe('a fleet of three on one Redis', () => {
    const LIFETIME_S = 4;
    const AHEAD_S = 1;
    const LIFETIMES = 4;
    let shortLived: AuthServer;
    let fleet: Stack;

    beforeAll(async () => {
      shortLived = await startAuthServer({
        ttlSeconds: LIFETIME_S,
        tls: { key: certs.serverKey, cert: certs.serverCert, clientCa: certs.ca },
        certificateBoundAccessTokens: true,
        mtlsAlias: true,
        clients: [
          {
            client_id: 'shop-bound',
            token_endpoint_auth_method: 'tls_client_auth',
            tls_client_auth_subject_dn: certs.clientSubject,
            tls_client_certificate_bound_access_tokens: true,
          },
          {
            client_id: INTROSPECTOR.id,
            client_secret: INTROSPECTOR.secret,
            token_endpoint_auth_method: 'client_secret_basic',
          },
        ],
      });
      introspectAt = shortLived;
      fleet = await startStack({
        name: 'broker-bound-fleet',
        inProcess: true,
        redis: 'standalone',
        replicas: 3,
        clients: [
          bound('bound', pair(certs.clientCert, certs.clientKey), {
            tokenRequest: { grant: 'rfc6749', issuer: shortLived.url, auth: 'tls_client_auth' },
          }),
        ],
        env: {
          LOG_LEVEL: 'warn',
          TOKEN_REFRESH_AHEAD_SECONDS: String(AHEAD_S),
          TOKEN_DEFAULT_LIFETIME_SECONDS: String(LIFETIME_S),
          // The load outruns the passthrough's default rates; they are not the subject here.
          FORWARD_CLIENT_RATE_PER_SECOND: '0',
          FORWARD_CALLER_RATE_PER_SECOND: '0',
        },
      });
    });
    afterAll(async () => {
      await fleet?.close();
      await shortLived?.stop();
      introspectAt = undefined;
    });

    it(`makes one token request per lifetime over ${LIFETIMES} lifetimes; every replica's passthrough call is accepted`, async () => {
      seen.length = 0;
      const result = await hammer({
        urls: fleet.brokers.map((b) => b.url),
        path: '/provider/bound/api/marketing/v1/offers',
        concurrency: 3,
        durationMs: LIFETIME_S * LIFETIMES * 1000,
      });
      const grants = shortLived.grants();
      const times = grants.filter((g) => g.event === 'grant').map((g) => g.at);
      const cycles = requestsPerCycle(times, (LIFETIME_S - AHEAD_S - 0.25) * 1000 * 0.5);
      const verdicts = seen.reduce<Record<string, number>>(
        (n, c) => ({ ...n, [c.verdict]: (n[c.verdict] ?? 0) + 1 }),
        {},
      );
      console.log(
        `certificate-bound fleet: ${result.calls} passthrough calls, ${result.failureCount} failures, ` +
          `statuses ${JSON.stringify(result.byStatus)}, resource server ${JSON.stringify(verdicts)}; ` +
          `${times.length} token requests in ${cycles.length} cycles (max ${Math.max(...cycles)} per cycle), ` +
          `${(result.durationMs / 1000).toFixed(1)} s, intervals ${times
            .slice(1)
            .map((t, i) => ((t - times[i]) / 1000).toFixed(2))
            .join(' ')} s`,
      );
      expect({
        failures: result.failures,
        statuses: Object.keys(result.byStatus),
        grantErrors: grants.filter((g) => g.event === 'grant_error'),
        refused: seen.filter((c) => c.verdict !== 'accepted'),
        enoughCycles: cycles.length >= LIFETIMES,
        maxPerCycle: Math.max(...cycles),
      }).toEqual({
        failures: [],
        statuses: ['200'],
        grantErrors: [],
        refused: [],
        enoughCycles: true,
        maxPerCycle: 1,
      });
      expect(result.calls).toBeGreaterThan(100);
    }, 60_000);
  });

  describe('configuration errors, named with the client and the setting', () => {
    /** The first `GET /token` answer of `client` whose detail matches `expected`. */
    const failure = async (client: StackClient, expected: RegExp) => {
      const other = await startStack({
        name: `broker-bound-${client.id}`,
        inProcess: true,
        replicas: 0,
        clients: [client],
        env: { LOG_LEVEL: 'fatal', TOKEN_BACKOFF_MAX_MS: '300' },
      });
      let last: unknown;
      try {
        const broker = await other.addBroker({ wait: 'listening' });
        return await waitFor(
          async () => {
            const res = await fetch(`${broker.url}/token?client=${client.id}`);
            const body = (await res.json()) as { code?: string; detail?: string };
            last = { status: res.status, ...body };
            return res.status === 503 && expected.test(body.detail ?? '') ? body : undefined;
          },
          { timeoutMs: 15_000, intervalMs: 100, what: `client ${client.id} to fail` },
        );
      } catch (err) {
        throw new Error(`last answer: ${JSON.stringify(last)}`, { cause: err });
      } finally {
        await other.close();
      }
    };

    it('a server CA the client does not trust: names caFile', async () => {
      const answer = await failure(
        bound('untrusted', pair(certs.clientCert, certs.clientKey), { caFile: undefined }),
        /client "untrusted".*TLS certificate is not trusted \((SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT_LOCALLY)\).*caFile/,
      );
      expect(answer.code).toBe('token_unavailable');
    });

    it('a certificate and key that do not belong together: names the credentials', async () => {
      await failure(
        bound('mismatch', pair(certs.clientCert, certs.otherKey)),
        /client "mismatch".*cannot be used together \(ERR_OSSL_X509_KEY_VALUES_MISMATCH\)/,
      );
    });

    it('an issuer whose metadata names another: names tokenRequest.issuer', async () => {
      await failure(
        bound('other-issuer', pair(certs.clientCert, certs.clientKey), {
          tokenRequest: {
            grant: 'rfc6749',
            issuer: `${as.url}/`,
            auth: 'tls_client_auth',
          },
        }),
        /client "other-issuer".*names issuer ".*", not the configured tokenRequest.issuer/,
      );
    });

    it('an auth method the metadata does not list: names tokenRequest.auth', async () => {
      await failure(
        bound('unlisted', pair(certs.clientCert, certs.clientKey), {
          tokenRequest: {
            grant: 'rfc6749',
            issuer: as.url,
            auth: 'private_key_jwt',
          },
        }),
        /client "unlisted".*does not list tokenRequest.auth "private_key_jwt" in token_endpoint_auth_methods_supported \(client_secret_basic, tls_client_auth, self_signed_tls_client_auth\)/,
      );
    });
  });
});
