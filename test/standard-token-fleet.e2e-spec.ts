import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type AuthServer, introspect, startAuthServer } from './support/auth-server';
import { type Fleet, FLEET_CLIENT, requestsPerCycle, startFleet } from './support/fleet';
import { hammer } from './support/load';

const CLIENT = { id: 'fleet-shop', secret: 'fleet-shop-secret-0123456789abcdef' };
const INTROSPECTOR = { id: 'introspector', secret: 'introspector-secret-0123456789abcdef' };

/**
 * The product's promise on a standard profile: three replicas sharing one Redis and one
 * oidc-provider client (client_secret_post) make one token request per token lifetime, under
 * load, and never serve an expired token.
 */
describe('fleet of 3 brokers on one oidc-provider client', () => {
  const LIFETIME_S = 4;
  const AHEAD_S = 1;
  const LIFETIMES = 6;
  let as: AuthServer;
  let fleet: Fleet;

  beforeAll(async () => {
    as = await startAuthServer({
      ttlSeconds: LIFETIME_S,
      clients: [
        {
          client_id: CLIENT.id,
          client_secret: CLIENT.secret,
          token_endpoint_auth_method: 'client_secret_post',
        },
        {
          client_id: INTROSPECTOR.id,
          client_secret: INTROSPECTOR.secret,
          token_endpoint_auth_method: 'client_secret_basic',
        },
      ],
    });
    const credentialsFile = join(mkdtempSync(join(tmpdir(), 'tb-std-fleet-')), 'credentials.json');
    writeFileSync(
      credentialsFile,
      JSON.stringify({ client_id: CLIENT.id, client_secret: CLIENT.secret }),
      { mode: 0o600 },
    );
    // The fleet harness's emulator stays idle: every broker asks the authorization server.
    fleet = await startFleet({
      size: 3,
      env: {
        PROVIDER_AUTH_URL: as.url,
        PROVIDER_BASE_URL: as.url,
        CREDENTIALS_FILE: credentialsFile,
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: as.tokenUrl,
        TOKEN_REQUEST_AUTH: 'client_secret_post',
        TOKEN_REFRESH_AHEAD_SECONDS: String(AHEAD_S),
        TOKEN_DEFAULT_LIFETIME_SECONDS: String(LIFETIME_S),
      },
    });
  });

  afterAll(async () => {
    await fleet?.stop();
    await as?.stop();
  });

  it(`makes one token request per lifetime over ${LIFETIMES} lifetimes, with no caller error and no expired token`, async () => {
    const result = await hammer({
      urls: fleet.brokers.map((b) => b.url),
      path: `/token?client=${FLEET_CLIENT}`,
      concurrency: 12,
      durationMs: LIFETIME_S * LIFETIMES * 1000,
      validate: (res) => {
        if (res.status !== 200) return `status ${res.status}`;
        const body = JSON.parse(res.body) as { expires_at: string; expires_in: number };
        if (Date.parse(body.expires_at) <= res.receivedAt) return `expired token from ${res.url}`;
        if (body.expires_in > LIFETIME_S) return `expires_in ${body.expires_in} over the lifetime`;
        return null;
      },
    });

    const grants = as.grants();
    const times = grants.filter((g) => g.event === 'grant').map((g) => g.at);
    // A cycle refreshes at expiry - lead - jitter: requests closer than half of that are a
    // second replica fetching in the same cycle.
    const cycles = requestsPerCycle(times, (LIFETIME_S - AHEAD_S - 0.25) * 1000 * 0.5);
    console.log(
      `standard fleet: ${result.calls} calls, ${result.failureCount} failures, ${result.validationErrorCount} invalid; ` +
        `${times.length} token requests in ${cycles.length} cycles (max ${Math.max(...cycles)} per cycle)`,
    );
    expect(grants.filter((g) => g.event === 'grant_error')).toEqual([]);
    expect(result.calls).toBeGreaterThan(500);
    expect(result.failures).toEqual([]);
    expect(result.validationErrors).toEqual([]);
    expect(cycles.length).toBeGreaterThanOrEqual(LIFETIMES);
    expect(Math.max(...cycles)).toBe(1);

    // What the fleet serves now is a token the server still holds active.
    const res = await fetch(`${fleet.brokers[0].url}/token?client=${FLEET_CLIENT}`);
    const { access_token } = (await res.json()) as { access_token: string };
    await expect(introspect(as, access_token, INTROSPECTOR)).resolves.toMatchObject({
      active: true,
      client_id: CLIENT.id,
    });
  }, 90_000);
});
