import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeTestCertificates } from '../../test/support/test-certificates';
import { generateKeyPairSync } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { decodeProtectedHeader, jwtVerify } from 'jose';
import { testClient } from '../../test/support/test-config';
import { providerSettingsSchema } from '../config/provider.schema';
import type { ClientCredentials } from '../secrets/client-credentials';
import { ProviderErrorCode } from './provider.exception';
import { createProviderAgent } from './provider-http';
import type { ProviderMetadataCache } from './provider-metadata';
import { AuthServerClient, INVALID_CLIENT_CHECKS } from './auth-server.client';
import type { Agent } from 'undici';

interface Seen {
  path: string;
  headers: IncomingMessage['headers'];
  form: URLSearchParams;
}

/** The RFC 6749 token request against a loopback server that records what it was sent. */
describe(AuthServerClient.name, () => {
  const settings = providerSettingsSchema.parse({ connectTimeoutMs: 500, responseTimeoutMs: 2000 });
  const SECRET = { clientId: 'shop id', clientSecret: 's3cr3t:+&' };
  let server: Server;
  let url: string;
  let seen: Seen[];
  let answer: { status: number; body: string };
  let agent: Agent;
  let grantor: AuthServerClient;

  beforeEach(async () => {
    seen = [];
    answer = { status: 200, body: '{"access_token":"at-1","token_type":"Bearer","expires_in":60}' };
    server = createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => {
        seen.push({ path: req.url!, headers: req.headers, form: new URLSearchParams(body) });
        res.writeHead(answer.status, { 'content-type': 'application/json' });
        res.end(answer.body);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    agent = createProviderAgent(settings);
    grantor = new AuthServerClient(agent, settings, 1800, () => 1_000_000);
  });
  afterEach(async () => {
    await grantor.close();
    await agent.destroy();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const client = (tokenRequest: Record<string, unknown>) =>
    testClient({
      id: 'shipping',
      authUrl: url,
      baseUrl: url,
      tokenRequest: { grant: 'rfc6749', url: `${url}/oauth2/token?tenant=acme`, ...tokenRequest },
    });

  it('posts a form with client_secret_basic, scope, audience, resources, params and headers', async () => {
    const grant = await grantor.requestToken(
      client({
        scope: 'orders:write offers:read',
        audience: 'https://api.example.com',
        resource: ['https://api.example.com/a', 'https://api.example.com/b'],
        params: { team: 'checkout' },
        headers: { 'X-Tenant': 'acme' },
      }),
      SECRET,
    );
    expect(grant).toEqual({
      accessToken: 'at-1',
      obtainedAt: 1_000_000,
      expiresAt: 1_060_000,
      lifetimeSeconds: 60,
    });
    const [req] = seen;
    expect(req.path).toBe('/oauth2/token?tenant=acme');
    expect(req.headers['content-type']).toBe('application/x-www-form-urlencoded');
    expect(req.headers['x-tenant']).toBe('acme');
    // RFC 6749 §2.3.1: form-encoded before Basic encoding.
    expect(req.headers.authorization).toBe(
      `Basic ${Buffer.from('shop+id:s3cr3t%3A%2B%26').toString('base64')}`,
    );
    expect([...req.form]).toEqual([
      ['grant_type', 'client_credentials'],
      ['scope', 'orders:write offers:read'],
      ['audience', 'https://api.example.com'],
      ['resource', 'https://api.example.com/a'],
      ['resource', 'https://api.example.com/b'],
      ['team', 'checkout'],
    ]);
  });

  it('sends client_secret_post credentials in the body, and no Authorization header', async () => {
    await grantor.requestToken(client({ auth: 'client_secret_post' }), SECRET);
    const [req] = seen;
    expect(req.headers.authorization).toBeUndefined();
    expect(req.form.get('client_id')).toBe('shop id');
    expect(req.form.get('client_secret')).toBe('s3cr3t:+&');
  });

  it.each([
    ['RS256', 'rsa', {}],
    ['PS256', 'rsa', {}],
    ['ES256', 'ec', { namedCurve: 'P-256' }],
    ['EdDSA', 'ed25519', {}],
  ] as const)(
    'signs a private_key_jwt assertion with %s: the token endpoint as audience, a unique jti, a short life',
    async (alg, type, options) => {
      const { privateKey, publicKey } = generateKeyPairSync(
        type as 'rsa',
        {
          modulusLength: 2048,
          ...options,
        } as { modulusLength: number },
      );
      const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
      const jwk = JSON.stringify({ ...privateKey.export({ format: 'jwk' }), kid: 'from-jwk' });
      const keyed: ClientCredentials = { clientId: 'shipping-client', privateKey: pem };
      const profile = client({ auth: 'private_key_jwt', assertion: { alg, kid: 'k-2026' } });
      await grantor.requestToken(profile, keyed);
      await grantor.requestToken(profile, keyed);
      await grantor.requestToken(client({ auth: 'private_key_jwt', assertion: { alg } }), {
        ...keyed,
        privateKey: jwk,
      });

      const jtis = new Set<string>();
      for (const [i, req] of seen.entries()) {
        expect(req.headers.authorization).toBeUndefined();
        expect(req.form.get('client_id')).toBe('shipping-client');
        expect(req.form.get('client_assertion_type')).toBe(
          'urn:ietf:params:oauth:client-assertion-type:jwt-bearer',
        );
        const jwt = req.form.get('client_assertion')!;
        expect(decodeProtectedHeader(jwt)).toMatchObject({
          alg,
          kid: i < 2 ? 'k-2026' : 'from-jwk',
        });
        const { payload } = await jwtVerify(jwt, publicKey, {
          issuer: 'shipping-client',
          subject: 'shipping-client',
          audience: `${url}/oauth2/token?tenant=acme`,
          currentDate: new Date(1_000_000),
        });
        expect(payload.exp! - payload.iat!).toBe(60);
        jtis.add(payload.jti!);
      }
      expect(jtis.size).toBe(3);
    },
  );

  it('addresses the assertion to the issuer with assertion.audience "issuer"', async () => {
    const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    const issuer = 'https://as.example.test';
    // The issuer's metadata is not read: tokenRequest.url wins, and this stands in for it.
    const metadata = {
      get: () => Promise.resolve({ issuer, from: issuer, tokenEndpoint: `${issuer}/token` }),
    } as unknown as ProviderMetadataCache;
    const withIssuer = new AuthServerClient(agent, settings, 1800, () => 1_000_000, { metadata });
    await withIssuer.requestToken(
      client({ auth: 'private_key_jwt', issuer, assertion: { alg: 'ES256', audience: 'issuer' } }),
      { clientId: 'shipping-client', privateKey: pem },
    );
    const jwt = seen[0].form.get('client_assertion')!;
    const { payload } = await jwtVerify(jwt, publicKey, {
      audience: issuer,
      currentDate: new Date(1_000_000),
    });
    expect(payload.aud).toBe(issuer);
    // Posted to the configured url all the same.
    expect(seen[0].path).toBe('/oauth2/token?tenant=acme');
  });

  it('refuses a key that does not fit the algorithm before sending anything, never quoting it', async () => {
    const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    const err = (await grantor
      .requestToken(client({ auth: 'private_key_jwt', assertion: { alg: 'RS256' } }), {
        clientId: 'c',
        privateKey: pem,
      })
      .catch((e: unknown) => e)) as Error & { code: string };
    expect(err).toMatchObject({ code: ProviderErrorCode.Rejected });
    expect(err.message).toContain('tokenRequest.assertion.alg');
    expect(err.message).not.toContain(pem.split('\n')[1]);
    expect(seen).toHaveLength(0);
  });

  it('translates invalid_client as the provider path does, never quoting the body', async () => {
    answer = { status: 400, body: '{"error":"invalid_client","error_description":"s3cr3t"}' };
    const err = (await grantor
      .requestToken(client({}), SECRET)
      .catch((e: unknown) => e)) as Error & { code: string };
    expect(err).toMatchObject({ code: ProviderErrorCode.InvalidClient });
    expect(err.message).not.toContain('s3cr3t');
  });

  describe('on invalid_client, names what to check for the client authentication', () => {
    const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const KEY = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    const refused = async (
      tokenRequest: Record<string, unknown>,
      credentials: ClientCredentials,
    ) => {
      answer = { status: 401, body: '{"error":"invalid_client"}' };
      const c = client({ auth: 'client_secret_post' });
      // Built past the schema: it wants https:// for mutual TLS, and the loopback speaks http,
      // where the pool's certificate goes unused. The message does not depend on the handshake.
      const err = (await grantor
        .requestToken({ ...c, tokenRequest: { ...c.tokenRequest, ...tokenRequest } }, credentials)
        .catch((e: unknown) => e)) as Error & { code: string };
      expect(err).toMatchObject({ code: ProviderErrorCode.InvalidClient });
      return err.message;
    };

    it.each(['client_secret_basic', 'client_secret_post'] as const)(
      '%s: the secret',
      async (auth) => {
        const message = await refused({ auth }, SECRET);
        expect(message).toContain(`check ${INVALID_CLIENT_CHECKS[auth]}`);
        expect(message).toMatch(/client_secret/);
        expect(message).not.toContain(SECRET.clientSecret);
      },
    );

    it('private_key_jwt: the private key and its kid', async () => {
      const message = await refused(
        { auth: 'private_key_jwt', assertion: { alg: 'ES256', lifetimeSeconds: 60 } },
        {
          clientId: 'c',
          privateKey: KEY,
        },
      );
      expect(message).toMatch(/public key .* kid and alg of tokenRequest.assertion/);
      expect(message).not.toMatch(/secret/);
    });

    it('tls_client_auth: the client certificate', async () => {
      // A real pair: the agent checks that the certificate and key belong together.
      const dir = mkdtempSync(join(tmpdir(), 'tb-rfc6749-mtls-'));
      const certs = makeTestCertificates(dir);
      const message = await refused(
        { auth: 'tls_client_auth' },
        {
          clientId: 'c',
          certificate: readFileSync(certs.clientCert, 'utf8'),
          privateKey: readFileSync(certs.clientKey, 'utf8'),
        },
      ).finally(() => rmSync(dir, { recursive: true, force: true }));
      expect(message).toMatch(/registered the client certificate/);
      expect(message).not.toMatch(/secret/);
    });
  });
});
