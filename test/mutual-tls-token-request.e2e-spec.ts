import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type AuthServer, introspect, startAuthServer } from './support/auth-server';
import {
  type Stack,
  type StackBroker,
  type StackClient,
  type StackCredentials,
  type StackOptions,
  startStack,
} from './support/stack';
import { makeTestCertificates, type TestCertificates } from './support/test-certificates';
import { waitFor } from './support/wait';

const INTROSPECTOR = { id: 'introspector', secret: 'introspector-secret-0123456789abcdef' };

/**
 * tls_client_auth (RFC 8705) against oidc-provider behind an https server that asks for a
 * client certificate: the broker presents the client's certificate to that client's token
 * endpoint only. Certificates are made with openssl in the test's temporary directory; the
 * broker trusts the test CA through NODE_EXTRA_CA_CERTS, as an operator makes it trust a private
 * CA: Node reads it when the process starts, so the brokers are processes.
 */
describe('tls_client_auth against oidc-provider over mutual TLS', () => {
  let certs: TestCertificates;
  let as: AuthServer;
  let stack: Stack;
  let broker: StackBroker;
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'tb-mtls-'));
    certs = makeTestCertificates(dir);
    as = await startAuthServer({
      tls: { key: certs.serverKey, cert: certs.serverCert, clientCa: certs.ca },
      clients: [
        {
          client_id: 'shop-mtls',
          token_endpoint_auth_method: 'tls_client_auth',
          tls_client_auth_subject_dn: certs.clientSubject,
        },
        {
          client_id: 'shop-post',
          client_secret: 'post-secret-0123456789abcdef01234',
          token_endpoint_auth_method: 'client_secret_post',
        },
        {
          client_id: INTROSPECTOR.id,
          client_secret: INTROSPECTOR.secret,
          token_endpoint_auth_method: 'client_secret_basic',
        },
      ],
    });
    stack = await stackOf('broker-mtls', [
      client('mtls', pair(certs.clientCert, certs.clientKey), 'tls_client_auth'),
      client(
        'post',
        { client_id: 'shop-post', client_secret: 'post-secret-0123456789abcdef01234' },
        'client_secret_post',
      ),
    ]);
    broker = stack.broker;
  });

  /** The credentials of the `shop-mtls` client with this certificate and key (PEM files). */
  const pair = (cert: string, key: string): StackCredentials => ({
    client_id: 'shop-mtls',
    certificate: readFileSync(cert, 'utf8'),
    private_key: readFileSync(key, 'utf8'),
  });
  /** A client of the authorization server, authenticating with `auth`. */
  const client = (
    id: string,
    credentials: StackCredentials,
    auth: string,
    config: Record<string, unknown> = {},
  ): StackClient => ({
    id,
    credentials,
    config: {
      authUrl: as.url,
      baseUrl: as.url,
      tokenRequest: { grant: 'rfc6749', url: as.tokenUrl, auth },
      ...config,
    },
  });
  /** A stack of broker processes on these clients, trusting the test CA. */
  const stackOf = (name: string, clients: StackClient[], opts: StackOptions = {}) =>
    startStack({
      name,
      clients,
      ...opts,
      env: {
        NODE_EXTRA_CA_CERTS: certs.ca,
        LOG_LEVEL: 'warn',
        TOKEN_REFRESH_AHEAD_SECONDS: '10',
        ...opts.env,
      },
    });

  afterAll(async () => {
    await stack?.close();
    await as?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('obtains a token with the client certificate, which the server says is active', async () => {
    const res = await fetch(`${broker.url}/token?client=mtls`);
    expect(res.status).toBe(200);
    const { access_token } = (await res.json()) as { access_token: string };
    await expect(introspect(as, access_token, INTROSPECTOR, certs.ca)).resolves.toMatchObject({
      active: true,
      client_id: 'shop-mtls',
    });
  });

  it("presents the certificate on that client's requests only", async () => {
    const res = await fetch(`${broker.url}/token?client=post`);
    expect(res.status).toBe(200);
    const grants = as.grants();
    expect(grants.filter((g) => g.event === 'grant_error')).toEqual([]);
    expect(grants.map((g) => [g.client, g.certificate]).sort()).toEqual([
      ['shop-mtls', 'broker-client'],
      ['shop-post', null],
    ]);
  });

  it('reads the certificate and key from Secrets Manager through the AWS SDK', async () => {
    // The stack keeps the pair in its Secrets Manager emulator, as `token-broker/mtls`.
    const fromSecret = await stackOf(
      'broker-mtls-secrets-manager',
      [client('mtls', pair(certs.clientCert, certs.clientKey), 'tls_client_auth')],
      { secrets: 'secrets-manager' },
    );
    try {
      const res = await fetch(`${fromSecret.broker.url}/token?client=mtls`);
      expect(res.status).toBe(200);
      const { access_token } = (await res.json()) as { access_token: string };
      await expect(introspect(as, access_token, INTROSPECTOR, certs.ca)).resolves.toMatchObject({
        active: true,
        client_id: 'shop-mtls',
      });
      expect(fromSecret.secrets!.stats.bySecret['token-broker/mtls']).toBeGreaterThanOrEqual(1);
    } finally {
      await fromSecret.close();
    }
  });

  it('is refused, and says so, with a certificate the server does not hold for the client', async () => {
    // Never ready: awaited listening only.
    const other = await stackOf(
      'broker-mtls-other-certificate',
      [client('mtls', pair(certs.otherCert, certs.otherKey), 'tls_client_auth')],
      { replicas: 0 },
    );
    const intruder = await other.addBroker({ wait: 'listening' });
    try {
      const answer = await waitFor(
        async () => {
          const res = await fetch(`${intruder.url}/token?client=mtls`);
          const body = (await res.json()) as { code?: string };
          return body.code === 'credentials_rejected' ? { status: res.status, body } : undefined;
        },
        { timeoutMs: 15_000, intervalMs: 100, what: 'the refusal to reach callers' },
      );
      expect(answer.status).toBe(503);
      const refused = as.grants().filter((g) => g.event === 'grant_error');
      expect(refused.map((g) => [g.client, g.error, g.certificate])).toEqual([
        ['shop-mtls', 'invalid_client', 'another-client'],
      ]);
    } finally {
      await other.close();
    }
  });

  it('reads the certificate and key from files, and picks up a replaced pair after one invalid_client', async () => {
    // A Kubernetes Secret volume: tls.crt and tls.key point through ..data, a symlink the
    // kubelet swaps in one rename, so a reader never sees one new file beside one old.
    const mount = join(dir, 'tls-secret');
    let version = 0;
    const mountPair = (cert: string, key: string) => {
      const target = join(mount, `..v${++version}`);
      mkdirSync(target, { recursive: true });
      copyFileSync(cert, join(target, 'tls.crt'));
      copyFileSync(key, join(target, 'tls.key'));
      symlinkSync(target, join(mount, '..data-next'));
      renameSync(join(mount, '..data-next'), join(mount, '..data'));
    };
    // The certificate first mounted is one the server does not hold for the client.
    mountPair(certs.otherCert, certs.otherKey);
    symlinkSync('..data/tls.crt', join(mount, 'tls.crt'));
    symlinkSync('..data/tls.key', join(mount, 'tls.key'));
    const since = as.grants().length;
    // The config names the mounted files in place of the credentials the stack would write.
    const mounted = await stackOf(
      'broker-mtls-files',
      [
        client('mtls', { client_id: 'shop-mtls' }, 'tls_client_auth', {
          credentials: {
            clientId: 'shop-mtls',
            certificateFile: join(mount, 'tls.crt'),
            privateKeyFile: join(mount, 'tls.key'),
          },
        }),
      ],
      // The background probe after a permanent failure comes this often.
      { replicas: 0, env: { TOKEN_BACKOFF_MAX_MS: '300' } },
    );
    const files = await mounted.addBroker({ wait: 'listening' });
    try {
      const tokenAnswer = async () => {
        const res = await fetch(`${files.url}/token?client=mtls`);
        return { status: res.status, body: (await res.json()) as Record<string, unknown> };
      };
      await waitFor(
        async () => ((await tokenAnswer()).body.code === 'credentials_rejected' ? true : undefined),
        { timeoutMs: 15_000, intervalMs: 100, what: 'the first certificate to be refused' },
      );
      mountPair(certs.clientCert, certs.clientKey);
      const answer = await waitFor(
        async () => {
          const a = await tokenAnswer();
          return a.status === 200 ? a : undefined;
        },
        { timeoutMs: 15_000, intervalMs: 100, what: 'the replaced certificate to be used' },
      );
      await expect(
        introspect(as, answer.body.access_token as string, INTROSPECTOR, certs.ca),
      ).resolves.toMatchObject({ active: true, client_id: 'shop-mtls' });
      // Refused with the old pair until the refusal made the broker re-read the files, then
      // granted on the new pair at the first attempt.
      const seen = as
        .grants()
        .slice(since)
        .map((g) => [g.event, g.certificate]);
      expect(seen.at(-1)).toEqual(['grant', 'broker-client']);
      expect(seen.at(-2)).toEqual(['grant_error', 'another-client']);
      expect(seen.filter(([, cert]) => cert === 'broker-client')).toHaveLength(1);
    } finally {
      await mounted.close();
    }
  });
});
