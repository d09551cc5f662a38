/**
 * @alone: it times brokers under load; no other suite runs beside it (scripts/test.mjs).
 */
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { shortestRefreshMs } from '../src/token/refresh-schedule';
import { type AuthServer, introspect, startAuthServer } from './support/auth-server';
import { type Fleet, FLEET_CLIENT, requestsPerCycle, startFleet } from './support/fleet';
import { hammer, type HammerResponse, type HammerResult } from './support/load';
import { makeTestCertificates, type TestCertificates } from './support/test-certificates';

const INTROSPECTOR = { id: 'introspector', secret: 'introspector-secret-0123456789abcdef' };

/** One broker client per standard profile; `clientId` is its name at the authorization server. */
const PROFILES = [
  { auth: 'client_secret_basic', id: 'basic', clientId: 'fleet-basic' },
  // The post client keeps the fleet helpers' client id, as when it was the only one.
  { auth: 'client_secret_post', id: FLEET_CLIENT, clientId: 'fleet-shop' },
  { auth: 'private_key_jwt', id: 'jwt', clientId: 'fleet-jwt' },
  { auth: 'tls_client_auth', id: 'mtls', clientId: 'fleet-mtls' },
] as const;
const secretOf = (clientId: string) => `${clientId}-secret-0123456789abcdef0123`;

/**
 * The product's promise on every standard profile: three replicas sharing one Redis make one
 * token request per token lifetime for each client, under load, and never serve an expired
 * token. One oidc-provider on https, asking for a client certificate that only the
 * tls_client_auth client presents, serves the four profiles at once, so one run covers them all.
 */
describe('fleet of 3 brokers on one oidc-provider client per profile', () => {
  const LIFETIME_S = 4;
  const AHEAD_S = 1;
  const LIFETIMES = 6;
  const es256 = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  let certs: TestCertificates;
  let as: AuthServer;
  let fleet: Fleet;

  let dir: string | undefined;
  beforeAll(async () => {
    const folder = mkdtempSync(join(tmpdir(), 'tb-std-fleet-'));
    dir = folder;
    certs = makeTestCertificates(folder);
    as = await startAuthServer({
      ttlSeconds: LIFETIME_S,
      tls: { key: certs.serverKey, cert: certs.serverCert, clientCa: certs.ca },
      clients: [
        ...PROFILES.map(({ auth, clientId }) => ({
          client_id: clientId,
          token_endpoint_auth_method: auth,
          ...(auth === 'private_key_jwt'
            ? {
                token_endpoint_auth_signing_alg: 'ES256',
                jwks: {
                  keys: [{ ...es256.publicKey.export({ format: 'jwk' }), kid: 'es-1', use: 'sig' }],
                },
              }
            : auth === 'tls_client_auth'
              ? { tls_client_auth_subject_dn: certs.clientSubject }
              : { client_secret: secretOf(clientId) }),
        })),
        {
          client_id: INTROSPECTOR.id,
          client_secret: INTROSPECTOR.secret,
          token_endpoint_auth_method: 'client_secret_basic',
        },
      ],
    });
    const write = (name: string, value: object) => {
      const file = join(folder, name);
      writeFileSync(file, JSON.stringify(value), { mode: 0o600 });
      return file;
    };
    const credentials = (auth: string, clientId: string) =>
      auth === 'private_key_jwt'
        ? {
            client_id: clientId,
            private_key: es256.privateKey.export({ type: 'pkcs8', format: 'pem' }),
          }
        : auth === 'tls_client_auth'
          ? {
              client_id: clientId,
              certificate: readFileSync(certs.clientCert, 'utf8'),
              private_key: readFileSync(certs.clientKey, 'utf8'),
            }
          : { client_id: clientId, client_secret: secretOf(clientId) };
    const configFile = write('broker.json', {
      clients: PROFILES.map(({ auth, id, clientId }) => ({
        id,
        authUrl: as.url,
        baseUrl: as.url,
        credentials: { file: write(`${id}.json`, credentials(auth, clientId)) },
        tokenRequest: {
          grant: 'rfc6749',
          url: as.tokenUrl,
          auth,
          ...(auth === 'private_key_jwt' && { assertion: { alg: 'ES256', kid: 'es-1' } }),
        },
      })),
    });
    // The fleet harness's emulator stays idle: every broker asks the authorization server, for
    // the clients of this config file (in place of the harness's own).
    fleet = await startFleet({
      size: 3,
      env: {
        BROKER_CONFIG_FILE: configFile,
        NODE_EXTRA_CA_CERTS: certs.ca,
        TOKEN_REFRESH_AHEAD_SECONDS: String(AHEAD_S),
        TOKEN_DEFAULT_LIFETIME_SECONDS: String(LIFETIME_S),
      },
    });
  });

  afterAll(async () => {
    await fleet?.stop();
    await as?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const validate = (res: HammerResponse) => {
    if (res.status !== 200) return `status ${res.status}`;
    const body = JSON.parse(res.body) as { expires_at: string; expires_in: number };
    if (Date.parse(body.expires_at) <= res.receivedAt) return `expired token from ${res.url}`;
    if (body.expires_in > LIFETIME_S) return `expires_in ${body.expires_in} over the lifetime`;
    return null;
  };

  it(`makes one token request per lifetime per client over ${LIFETIMES} lifetimes, with no caller error and no expired token`, async () => {
    // Twelve request loops in all, as many as when the post client was the only one.
    const results = await Promise.all(
      PROFILES.map(({ id }) =>
        hammer({
          urls: fleet.brokers.map((b) => b.url),
          path: `/token?client=${id}`,
          concurrency: 3,
          durationMs: LIFETIME_S * LIFETIMES * 1000,
          validate,
        }),
      ),
    );

    const grants = as.grants();
    const lines: string[] = [];
    const outcomes = PROFILES.map(({ auth, clientId }, i) => {
      const mine = grants.filter((g) => g.client === clientId);
      const times = mine.filter((g) => g.event === 'grant').map((g) => g.at);
      // Cycles are at least the shortest refresh apart (refresh-schedule): requests closer than
      // half of that are a second replica fetching in the same cycle.
      const cycles = requestsPerCycle(
        times,
        shortestRefreshMs(AHEAD_S * 1000, LIFETIME_S * 1000) / 2,
      );
      lines.push(
        `${auth}: ${times.length} token requests in ${cycles.length} cycles (max ${Math.max(...cycles)} per cycle)`,
      );
      return {
        auth,
        grantErrors: mine.filter((g) => g.event === 'grant_error'),
        failures: results[i].failures,
        validationErrors: results[i].validationErrors,
        enoughCycles: cycles.length >= LIFETIMES,
        maxPerCycle: Math.max(...cycles),
      };
    });
    const sum = (count: (r: HammerResult) => number) => results.reduce((n, r) => n + count(r), 0);
    console.log(
      [
        `standard fleet: ${sum((r) => r.calls)} calls, ${sum((r) => r.failureCount)} failures, ${sum((r) => r.validationErrorCount)} invalid`,
        ...lines,
      ].join('\n'),
    );
    expect(outcomes).toEqual(
      PROFILES.map(({ auth }) => ({
        auth,
        grantErrors: [],
        failures: [],
        validationErrors: [],
        enoughCycles: true,
        maxPerCycle: 1,
      })),
    );
    expect(grants.filter((g) => g.event === 'grant_error')).toEqual([]);
    expect(results[PROFILES.findIndex((p) => p.id === FLEET_CLIENT)].calls).toBeGreaterThan(500);

    // What the fleet serves now is a token the server still holds active.
    const res = await fetch(`${fleet.brokers[0].url}/token?client=${FLEET_CLIENT}`);
    const { access_token } = (await res.json()) as { access_token: string };
    await expect(introspect(as, access_token, INTROSPECTOR, certs.ca)).resolves.toMatchObject({
      active: true,
      client_id: 'fleet-shop',
    });
  }, 90_000);
});
