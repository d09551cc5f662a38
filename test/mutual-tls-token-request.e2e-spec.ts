import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  SecretsManagerEmulator,
  secretsManagerClientEnv,
} from '../emulator/secrets-manager-emulator';
import { type AuthServer, introspect, startAuthServer } from './support/auth-server';
import { type BrokerProcess, spawnBroker } from './support/broker-process';
import { makeTestCertificates, type TestCertificates } from './support/test-certificates';
import { waitFor } from './support/wait';

const INTROSPECTOR = { id: 'introspector', secret: 'introspector-secret-0123456789abcdef' };

/**
 * tls_client_auth (RFC 8705) against oidc-provider behind an https server that asks for a
 * client certificate: the broker presents the client's certificate to that client's token
 * endpoint only. Certificates are made with openssl in the test's temporary directory; the
 * broker trusts the test CA through NODE_EXTRA_CA_CERTS.
 */
describe('tls_client_auth against oidc-provider over mutual TLS', () => {
  let certs: TestCertificates;
  let as: AuthServer;
  let broker: BrokerProcess;
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
    const configFile = write('broker.json', {
      clients: [
        client(
          'mtls',
          write('mtls.json', {
            client_id: 'shop-mtls',
            certificate: readFileSync(certs.clientCert, 'utf8'),
            private_key: readFileSync(certs.clientKey, 'utf8'),
          }),
          { auth: 'tls_client_auth' },
        ),
        client(
          'post',
          write('post.json', {
            client_id: 'shop-post',
            client_secret: 'post-secret-0123456789abcdef01234',
          }),
          { auth: 'client_secret_post' },
        ),
      ],
    });
    broker = await spawnBroker({ name: 'broker-mtls', env: env(configFile) });
    await broker.waitReady(20_000);
  });

  const write = (name: string, value: object) => {
    const file = join(dir, name);
    writeFileSync(file, JSON.stringify(value), { mode: 0o600 });
    return file;
  };
  const client = (id: string, credentials: string, tokenRequest: object) => ({
    id,
    authUrl: as.url,
    baseUrl: as.url,
    credentials: { file: credentials },
    tokenRequest: { grant: 'rfc6749', url: as.tokenUrl, ...tokenRequest },
  });
  const env = (configFile: string) => ({
    BROKER_CONFIG_FILE: configFile,
    NODE_EXTRA_CA_CERTS: certs.ca,
    CALLER_AUTH_MODE: 'none',
    CALLER_AUTH_ALLOW_NONE: 'true',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    TOKEN_REFRESH_AHEAD_SECONDS: '10',
  });

  afterAll(async () => {
    await broker?.stop();
    await as?.stop();
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
    const secrets = await SecretsManagerEmulator.start({
      secrets: {
        'token-broker/mtls': JSON.stringify({
          client_id: 'shop-mtls',
          certificate: readFileSync(certs.clientCert, 'utf8'),
          private_key: readFileSync(certs.clientKey, 'utf8'),
        }),
      },
    });
    const fromSecret = await spawnBroker({
      name: 'broker-mtls-secrets-manager',
      env: {
        ...env(
          write('sm-broker.json', {
            clients: [
              {
                ...client('mtls', '', { auth: 'tls_client_auth' }),
                credentials: { secretId: 'token-broker/mtls' },
              },
            ],
          }),
        ),
        ...secretsManagerClientEnv(secrets.url),
      },
    });
    try {
      await fromSecret.waitReady(20_000);
      const res = await fetch(`${fromSecret.url}/token?client=mtls`);
      expect(res.status).toBe(200);
      const { access_token } = (await res.json()) as { access_token: string };
      await expect(introspect(as, access_token, INTROSPECTOR, certs.ca)).resolves.toMatchObject({
        active: true,
        client_id: 'shop-mtls',
      });
      expect(secrets.stats.bySecret['token-broker/mtls']).toBeGreaterThanOrEqual(1);
    } finally {
      await fromSecret.stop();
      await secrets.close();
    }
  });

  it('is refused, and says so, with a certificate the server does not hold for the client', async () => {
    const intruder = await spawnBroker({
      name: 'broker-mtls-other-certificate',
      env: env(
        write('other-broker.json', {
          clients: [
            client(
              'mtls',
              write('other.json', {
                client_id: 'shop-mtls',
                certificate: readFileSync(certs.otherCert, 'utf8'),
                private_key: readFileSync(certs.otherKey, 'utf8'),
              }),
              { auth: 'tls_client_auth' },
            ),
          ],
        }),
      ),
    });
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
      await intruder.stop();
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
    const files = await spawnBroker({
      name: 'broker-mtls-files',
      env: {
        ...env(
          write('files-broker.json', {
            clients: [
              {
                ...client('mtls', '', { auth: 'tls_client_auth' }),
                credentials: {
                  clientId: 'shop-mtls',
                  certificateFile: join(mount, 'tls.crt'),
                  privateKeyFile: join(mount, 'tls.key'),
                },
              },
            ],
          }),
        ),
        // The background probe after a permanent failure comes this often.
        TOKEN_BACKOFF_MAX_MS: '300',
      },
    });
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
      await files.stop();
    }
  });
});
