import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import { makeTestCertificates, type TestCertificates } from '../../test/support/test-certificates';
import { testClient } from '../../test/support/test-config';
import type { ClientInput } from '../../test/support/test-config';
import { ordersSettingsSchema, providerSettingsSchema } from '../config/provider.schema';
import type { ClientCredentials } from '../secrets/client-credentials';
import { AuthServerClient } from './auth-server.client';
import { ClientAgents } from './client-tls';
import { ProviderErrorCode, type ProviderException } from './provider.exception';
import { ClientCertificates, createCheckoutAgent, ProviderApiClient } from './provider-api.client';
import { createProviderAgent } from './provider-http';

/**
 * A client's own TLS: its certificate presented to its token endpoint and its API, its CA
 * trusted, and the TLS failures no retry mends told as configuration errors. Real TLS servers on
 * loopback, certificates made with openssl.
 */
describe('client TLS', () => {
  let dir: string;
  let certs: TestCertificates;
  /** Another CA: a server trusting only it refuses the client's certificate. */
  let foreign: TestCertificates;
  const servers: Server[] = [];
  const settings = providerSettingsSchema.parse({
    connectTimeoutMs: 1000,
    responseTimeoutMs: 1000,
  });
  const orders = ordersSettingsSchema.parse({});

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-client-tls-'));
    for (const sub of ['a', 'b']) mkdirSync(join(dir, sub));
    certs = makeTestCertificates(join(dir, 'a'));
    foreign = makeTestCertificates(join(dir, 'b'), 'foreign-client');
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  afterEach(async () => {
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  /** An https server on loopback answering a token; it records the certificate of each call. */
  async function serve(opts: { clientCa: string; rejectUnauthorized: boolean }) {
    const seen: Array<string | null> = [];
    const server = createServer(
      {
        key: readFileSync(certs.serverKey),
        cert: readFileSync(certs.serverCert),
        ca: readFileSync(opts.clientCa),
        requestCert: true,
        rejectUnauthorized: opts.rejectUnauthorized,
      },
      (req, res) => {
        seen.push((req.socket as TLSSocket).getPeerCertificate()?.subject?.CN ?? null);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"access_token":"t","token_type":"Bearer","expires_in":600}');
      },
    );
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return { url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
  }

  const mutual = (url: string, extra: Partial<ClientInput> = {}) =>
    testClient({
      id: 'shop',
      baseUrl: url,
      caFile: certs.ca,
      credentials: {
        clientId: 'shop',
        certificateFile: '/run/shop/tls.crt',
        privateKeyFile: '/run/shop/tls.key',
      },
      tokenRequest: { grant: 'rfc6749', url: `${url}/token`, auth: 'tls_client_auth' },
      ...extra,
    });
  const pair = (c = certs.clientCert, k = certs.clientKey): ClientCredentials => ({
    clientId: 'shop',
    certificate: readFileSync(c, 'utf8'),
    privateKey: readFileSync(k, 'utf8'),
  });
  const grantorFor = () =>
    new AuthServerClient(createProviderAgent(settings), settings, 600, Date.now);
  const refusal = async (promise: Promise<unknown>) => {
    const err = (await promise.then(
      () => undefined,
      (e: unknown) => e,
    )) as ProviderException;
    expect(err).toMatchObject({ code: ProviderErrorCode.Misconfigured });
    expect(err.transient).toBe(false);
    return err.message;
  };

  it('trusts the server by the client caFile alone, and presents the certificate', async () => {
    const server = await serve({ clientCa: certs.ca, rejectUnauthorized: true });
    const grantor = grantorFor();
    try {
      await expect(grantor.requestToken(mutual(server.url), pair())).resolves.toMatchObject({
        accessToken: 't',
      });
      expect(server.seen).toEqual(['broker-client']);
    } finally {
      await grantor.close();
    }
  });

  it('a server certificate it does not trust: permanent, naming caFile', async () => {
    const server = await serve({ clientCa: certs.ca, rejectUnauthorized: true });
    const grantor = grantorFor();
    try {
      const message = await refusal(
        grantor.requestToken(mutual(server.url, { caFile: undefined }), pair()),
      );
      expect(message).toMatch(
        /^token request for client "shop": the provider's TLS certificate is not trusted \((UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_GET_ISSUER_CERT_LOCALLY)\); .*set the client's caFile/,
      );
      expect(server.seen).toEqual([]);
    } finally {
      await grantor.close();
    }
  });

  it('a server refusing the certificate in the handshake: permanent, naming the key files', async () => {
    // It trusts another CA only.
    const server = await serve({ clientCa: foreign.ca, rejectUnauthorized: true });
    const grantor = grantorFor();
    try {
      const message = await refusal(grantor.requestToken(mutual(server.url), pair()));
      expect(message).toMatch(
        /^token request for client "shop": the provider refused the client certificate in the TLS handshake \((ERR_SSL_\w+_ALERT_\w+|it closed the connection right after the handshake)\); check that the server trusts the issuer of the certificate in the credentials \(key files "\/run\/shop\/tls.crt" \(credentials.certificateFile\) and "\/run\/shop\/tls.key" \(credentials.privateKeyFile\)\)/,
      );
      expect(server.seen).toEqual([]);
    } finally {
      await grantor.close();
    }
  });

  it('a connection reset by a server that accepts the certificate stays transient', async () => {
    const server = createServer(
      {
        key: readFileSync(certs.serverKey),
        cert: readFileSync(certs.serverCert),
        ca: readFileSync(certs.ca),
        requestCert: true,
        rejectUnauthorized: true,
      },
      (req) => req.socket.destroy(),
    );
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const grantor = grantorFor();
    try {
      const err = (await grantor.requestToken(mutual(url), pair()).catch((e: unknown) => e)) as
        | ProviderException
        | undefined;
      expect(err).toMatchObject({ code: ProviderErrorCode.Unreachable });
      expect(err?.transient).toBe(true);
    } finally {
      await grantor.close();
    }
  });

  it('a certificate and key that do not belong together: permanent, before any connection', async () => {
    const server = await serve({ clientCa: certs.ca, rejectUnauthorized: false });
    const grantor = grantorFor();
    try {
      const message = await refusal(
        grantor.requestToken(mutual(server.url), pair(certs.clientCert, certs.otherKey)),
      );
      expect(message).toContain(
        'token request for client "shop": the client certificate and private key in the credentials (key files "/run/shop/tls.crt" (credentials.certificateFile) and "/run/shop/tls.key" (credentials.privateKeyFile)) cannot be used together (ERR_OSSL_X509_KEY_VALUES_MISMATCH)',
      );
      expect(server.seen).toEqual([]);
    } finally {
      await grantor.close();
    }
  });

  it('an unreadable caFile: permanent, naming it', async () => {
    const grantor = grantorFor();
    try {
      const message = await refusal(
        grantor.requestToken(
          mutual('https://127.0.0.1:9', { caFile: join(dir, 'missing.pem') }),
          pair(),
        ),
      );
      expect(message).toContain(`cannot read the client's caFile "${join(dir, 'missing.pem')}"`);
    } finally {
      await grantor.close();
    }
  });

  describe(ClientAgents.name, () => {
    it('keeps one agent per client, replaces it (closing the old) when the certificate rotates', async () => {
      const agents = new ClientAgents((o) => createProviderAgent(settings, o), 60_000);
      const client = mutual('https://127.0.0.1:9');
      const first = agents.agentFor(client, pair(), 'call')!;
      expect(agents.agentFor(client, pair(), 'call')).toBe(first);
      // Another client never shares it, even with the same certificate.
      const other = agents.agentFor({ ...client, id: 'other' }, pair(), 'call')!;
      expect(other).not.toBe(first);
      const rotated = agents.agentFor(client, pair(certs.otherCert, certs.otherKey), 'call')!;
      expect(rotated).not.toBe(first);
      await new Promise((resolve) => setImmediate(resolve));
      expect(first.closed).toBe(true);
      expect(rotated.closed).toBe(false);
      await agents.close();
      expect([rotated.closed, other.closed]).toEqual([true, true]);
    });

    it('needs none for a client that presents no certificate and has no caFile', () => {
      const agents = new ClientAgents((o) => createProviderAgent(settings, o), 60_000);
      expect(agents.agentFor(testClient(), undefined, 'call')).toBeUndefined();
    });
  });

  describe('the API calls of a mutual-TLS client', () => {
    const get = (api: ProviderApiClient, client: ReturnType<typeof mutual>) =>
      api.call({
        client,
        accessToken: 'bound-token',
        method: 'GET',
        target: '/api/marketing/v1/offers',
        headers: {},
        maxResponseBytes: 65_536,
        limitSetting: 'FORWARD_MAX_RESPONSE_BYTES',
      });

    it('present the certificate the token was granted with, else the one its source holds', async () => {
      const server = await serve({ clientCa: certs.ca, rejectUnauthorized: true });
      const loads: string[] = [];
      const certificates = new ClientCertificates(async (c) => {
        loads.push(c.id);
        return pair();
      }, 60_000);
      const shared = createCheckoutAgent(orders);
      const api = new ProviderApiClient(shared, orders, 'token-broker', certificates);
      try {
        const client = mutual(server.url);
        await expect(get(api, client)).resolves.toMatchObject({ kind: 'answered', status: 200 });
        expect(loads).toEqual(['shop']);
        // A grant on this replica names the certificate its token is bound to.
        certificates.granted(client, pair(foreign.clientCert, foreign.clientKey));
        const refused = await get(api, client);
        expect(refused).toMatchObject({
          kind: 'failed',
          error: {
            code: ProviderErrorCode.Misconfigured,
            message: expect.stringContaining(
              'GET request for client "shop": the provider refused the client certificate in the TLS handshake',
            ),
          },
        });
        expect(server.seen).toEqual(['broker-client']);
        // Any other client presents nothing, whatever server it calls.
        const open = await serve({ clientCa: certs.ca, rejectUnauthorized: false });
        const plain = testClient({ id: 'plain', baseUrl: open.url, caFile: certs.ca });
        await expect(get(api, plain)).resolves.toMatchObject({ kind: 'answered', status: 200 });
        expect(open.seen).toEqual([null]);
      } finally {
        await api.close();
      }
    });
  });
});
