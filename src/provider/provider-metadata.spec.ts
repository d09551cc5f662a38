import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import type { Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeTestCertificates } from '../../test/support/test-certificates';
import { serveLoopback } from '../../test/support/loopback-server';
import { testClient } from '../../test/support/test-config';
import type { ClientInput } from '../../test/support/test-config';
import { providerSettingsSchema } from '../config/provider.schema';
import { ClientAgents } from './client-tls';
import { ProviderErrorCode } from './provider.exception';
import { createProviderAgent } from './provider-http';
import { metadataUrls, ProviderMetadataCache, tokenEndpointFrom } from './provider-metadata';

/** Discovery (RFC 8414 / OpenID Connect Discovery) against a real HTTP server on loopback. */
describe(ProviderMetadataCache.name, () => {
  const settings = providerSettingsSchema.parse({ connectTimeoutMs: 500, responseTimeoutMs: 500 });
  const agent = createProviderAgent(settings);
  const servers: Server[] = [];
  afterAll(() => agent.close());
  afterEach(async () => {
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  /** Serves `documents` by path; anything else 404. */
  async function serve(documents: (issuer: string) => Record<string, unknown>) {
    const requested: string[] = [];
    let issuer = '';
    let down = false;
    const s = await serveLoopback((req, res) => {
      requested.push(req.url ?? '');
      const doc = documents(issuer)[req.url ?? ''];
      if (down) res.writeHead(503).end();
      else if (doc === undefined) res.writeHead(404).end();
      else res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(doc));
    });
    servers.push(s.server);
    issuer = s.url;
    return { issuer, requested, setDown: (d: boolean) => (down = d) };
  }
  const metadata = (issuer: string, extra: Record<string, unknown> = {}) => ({
    issuer,
    token_endpoint: `${issuer}/token`,
    token_endpoint_auth_methods_supported: [
      'client_secret_basic',
      'private_key_jwt',
      'tls_client_auth',
    ],
    token_endpoint_auth_signing_alg_values_supported: ['ES256', 'PS256'],
    dpop_signing_alg_values_supported: ['ES256', 'EdDSA'],
    mtls_endpoint_aliases: { token_endpoint: 'https://mtls.example.test/token' },
    ...extra,
  });
  const client = (
    issuer: string,
    tokenRequest: Record<string, unknown> = {},
    extra: Partial<ClientInput> = {},
  ) =>
    testClient({
      id: 'shop',
      tokenRequest: { grant: 'rfc6749', issuer, auth: 'client_secret_basic', ...tokenRequest },
      ...extra,
    });
  const logged: string[] = [];
  const logger = { warn: (_o: unknown, m: string) => logged.push(m) } as never;
  const cache = () => new ProviderMetadataCache({ dispatcherFor: () => agent, settings, logger });

  it('puts the well-known suffix where RFC 8414 and OpenID Connect Discovery do', () => {
    expect(metadataUrls('https://as.example/')).toEqual([
      'https://as.example/.well-known/oauth-authorization-server',
      'https://as.example/.well-known/openid-configuration',
    ]);
    expect(metadataUrls('https://as.example/tenant/a')).toEqual([
      'https://as.example/.well-known/oauth-authorization-server/tenant/a',
      'https://as.example/tenant/a/.well-known/openid-configuration',
    ]);
  });

  it('reads RFC 8414 metadata, then OpenID metadata when there is none, and exposes what it found', async () => {
    const as = await serve((issuer) => ({
      '/.well-known/openid-configuration': metadata(issuer),
    }));
    const found = await cache().get(client(as.issuer));
    expect(as.requested).toEqual([
      '/.well-known/oauth-authorization-server',
      '/.well-known/openid-configuration',
    ]);
    expect(found).toEqual({
      issuer: as.issuer,
      from: `${as.issuer}/.well-known/openid-configuration`,
      tokenEndpoint: `${as.issuer}/token`,
      mtlsTokenEndpoint: 'https://mtls.example.test/token',
      tokenEndpointAuthMethods: ['client_secret_basic', 'private_key_jwt', 'tls_client_auth'],
      tokenEndpointAuthSigningAlgs: ['ES256', 'PS256'],
      dpopSigningAlgs: ['ES256', 'EdDSA'],
    });
  });

  it('takes the mTLS alias for the mutual-TLS methods; an explicit tokenRequest.url wins', async () => {
    const as = await serve((issuer) => ({
      '/.well-known/oauth-authorization-server': metadata(issuer),
    }));
    const reader = cache();
    const mtls = client(as.issuer, { auth: 'tls_client_auth' });
    expect(tokenEndpointFrom(mtls, (await reader.get(mtls))!)).toBe(
      'https://mtls.example.test/token',
    );
    const basic = client(as.issuer);
    expect(tokenEndpointFrom(basic, (await reader.get(basic))!)).toBe(`${as.issuer}/token`);
    const pinned = client(as.issuer, { url: 'http://127.0.0.1:9/oauth/token' });
    expect(tokenEndpointFrom(pinned, (await reader.get(pinned))!)).toBe(
      'http://127.0.0.1:9/oauth/token',
    );
  });

  it.each([
    [
      'an issuer that is not the configured one',
      (issuer: string) => metadata(`${issuer}/other`),
      {},
      /client "shop": .* names issuer ".*\/other", not the configured tokenRequest.issuer/,
    ],
    [
      'an auth method it does not list',
      (issuer: string) => metadata(issuer),
      { auth: 'client_secret_post' },
      /client "shop": the metadata of tokenRequest.issuer ".*" \(.*\) does not list tokenRequest.auth "client_secret_post" in token_endpoint_auth_methods_supported \(client_secret_basic, private_key_jwt, tls_client_auth\); set tokenRequest.auth to one of them/,
    ],
    [
      'no auth method list, for a method other than the default',
      (issuer: string) => metadata(issuer, { token_endpoint_auth_methods_supported: undefined }),
      { auth: 'client_secret_post' },
      /does not list tokenRequest.auth "client_secret_post" .*\(client_secret_basic, the default when omitted\)/,
    ],
    [
      'an assertion alg it does not list',
      (issuer: string) => metadata(issuer),
      { auth: 'private_key_jwt', assertion: { alg: 'RS256' } },
      /does not list tokenRequest.assertion.alg "RS256" in token_endpoint_auth_signing_alg_values_supported \(ES256, PS256\)/,
    ],
    [
      'a document without a token endpoint',
      (issuer: string) => metadata(issuer, { token_endpoint: undefined }),
      {},
      /is not usable authorization server metadata \(token_endpoint missing or invalid\)/,
    ],
  ])('refuses %s, permanently, naming the setting', async (_label, doc, tokenRequest, expected) => {
    const as = await serve((issuer) => ({
      '/.well-known/oauth-authorization-server': doc(issuer),
    }));
    const err = (await cache()
      .get(client(as.issuer, tokenRequest))
      .catch((e: unknown) => e)) as Error & { code: string; transient: boolean };
    expect(err).toMatchObject({ code: ProviderErrorCode.Misconfigured, transient: false });
    expect(err.message).toMatch(expected);
  });

  it("refuses a plain http token endpoint from an https issuer, read over the client's caFile", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tb-metadata-'));
    const certs = makeTestCertificates(dir);
    const server = createHttpsServer(
      { key: readFileSync(certs.serverKey), cert: readFileSync(certs.serverCert) },
      (_req, res) => {
        const issuer = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ issuer, token_endpoint: 'http://127.0.0.1:9/token' }));
      },
    );
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const agents = new ClientAgents((o) => createProviderAgent(settings, o), 60_000);
    const reader = new ProviderMetadataCache({
      dispatcherFor: (c, what) => agents.agentFor(c, undefined, what) ?? agent,
      settings,
      logger,
    });
    try {
      const issuer = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
      await expect(reader.get(client(issuer, {}, { caFile: certs.ca }))).rejects.toMatchObject({
        code: ProviderErrorCode.Misconfigured,
        message: expect.stringContaining(
          'names a plain http:// token_endpoint for an https:// issuer; refused, the credentials would travel in clear',
        ),
      });
    } finally {
      await agents.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('is transient while the server fails, and refuses a server with no metadata at all', async () => {
    const as = await serve(() => ({}));
    as.setDown(true);
    const reader = cache();
    await expect(reader.get(client(as.issuer))).rejects.toMatchObject({
      code: ProviderErrorCode.ServerError,
      transient: true,
    });
    as.setDown(false);
    await expect(reader.get(client(as.issuer))).rejects.toMatchObject({
      code: ProviderErrorCode.Misconfigured,
      message: expect.stringMatching(
        /publishes no metadata .*HTTP 404.*HTTP 404.*set tokenRequest.url instead/,
      ),
    });
  });

  it('keeps the last good metadata through a failed re-read, and logs it', async () => {
    let endpoint = 'token';
    const as = await serve((issuer) => ({
      '/.well-known/oauth-authorization-server': metadata(issuer, {
        token_endpoint: `${issuer}/${endpoint}`,
      }),
    }));
    const reader = cache();
    const c = client(as.issuer);
    await reader.get(c);
    endpoint = 'token2';
    await reader.refresh(c);
    expect(reader.peek('shop')?.tokenEndpoint).toBe(`${as.issuer}/token2`);
    as.setDown(true);
    logged.length = 0;
    await reader.refresh(c);
    expect(logged).toEqual(['provider metadata re-read failed; the last good metadata is kept']);
    await expect(reader.get(c)).resolves.toMatchObject({ tokenEndpoint: `${as.issuer}/token2` });
  });

  it('reads nothing for a client without tokenRequest.issuer', async () => {
    await expect(cache().get(testClient())).resolves.toBeUndefined();
  });
});
