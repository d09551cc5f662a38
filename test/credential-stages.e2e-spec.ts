import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  SecretsManagerEmulator,
  secretsManagerClientEnv,
} from '../emulator/secrets-manager-emulator';
import { type AuthServer, startAuthServer } from './support/auth-server';
import { type BrokerProcess, spawnBroker } from './support/broker-process';

const secret = (client_id: string, client_secret: string) =>
  JSON.stringify({ client_id, client_secret });

/**
 * Rotation without a failed refresh: when the authorization server (oidc-provider) refuses the
 * current version of a Secrets Manager secret, the broker tries AWSPENDING (a rotation in
 * progress: the server already has the new secret) and then AWSPREVIOUS (the server still has
 * the old one), uses the first the server accepts and logs its stage. Secrets Manager is the
 * real SDK against the project's emulator.
 */
describe('credentials rotation across Secrets Manager staging labels', () => {
  let as: AuthServer;
  let secrets: SecretsManagerEmulator;
  let broker: BrokerProcess;

  beforeAll(async () => {
    as = await startAuthServer({
      clients: [
        {
          client_id: 'shop-pending',
          client_secret: 'pending-new-secret-0123456789abcdef',
          token_endpoint_auth_method: 'client_secret_basic',
        },
        {
          client_id: 'shop-previous',
          client_secret: 'previous-old-secret-0123456789abcdef',
          token_endpoint_auth_method: 'client_secret_post',
        },
      ],
    });
    secrets = await SecretsManagerEmulator.start({
      secrets: {
        'tb/pending': secret('shop-pending', 'pending-old-secret-0123456789abcdef'),
        'tb/previous': secret('shop-previous', 'previous-new-secret-0123456789abcdef'),
      },
    });
    secrets.setSecretStage(
      'tb/pending',
      'AWSPENDING',
      secret('shop-pending', 'pending-new-secret-0123456789abcdef'),
    );
    secrets.setSecretStage(
      'tb/previous',
      'AWSPREVIOUS',
      secret('shop-previous', 'previous-old-secret-0123456789abcdef'),
    );
    const dir = mkdtempSync(join(tmpdir(), 'tb-stages-'));
    const configFile = join(dir, 'broker.json');
    const client = (id: string, secretId: string, auth: string) => ({
      id,
      authUrl: as.url,
      baseUrl: as.url,
      credentials: { secretId },
      tokenRequest: { grant: 'rfc6749', url: as.tokenUrl, auth },
    });
    writeFileSync(
      configFile,
      JSON.stringify({
        clients: [
          client('pending', 'tb/pending', 'client_secret_basic'),
          client('previous', 'tb/previous', 'client_secret_post'),
        ],
      }),
    );
    broker = await spawnBroker({
      name: 'broker-stages',
      env: {
        BROKER_CONFIG_FILE: configFile,
        ...secretsManagerClientEnv(secrets.url),
        CALLER_AUTH_MODE: 'none',
        CALLER_AUTH_ALLOW_NONE: 'true',
        HOST: '127.0.0.1',
        LOG_LEVEL: 'info',
        TOKEN_REFRESH_AHEAD_SECONDS: '10',
      },
    });
    await broker.waitReady(20_000);
  });

  afterAll(async () => {
    await broker?.stop();
    await secrets?.close();
    await as?.stop();
  });

  it.each([
    ['pending', 'shop-pending', 'AWSPENDING'],
    ['previous', 'shop-previous', 'AWSPREVIOUS'],
  ])(
    'client %s (%s): the refused current version, then the one at %s, which the server accepts',
    async (client, clientId) => {
      const res = await fetch(`${broker.url}/token?client=${client}`);
      expect(res.status).toBe(200);
      const grants = as.grants().filter((g) => g.client === clientId);
      expect(grants.map((g) => g.event + (g.error ? `:${g.error}` : ''))).toEqual([
        'grant_error:invalid_client',
        'grant',
      ]);
    },
  );

  it('logs the stage each client was accepted at', async () => {
    // A graceful stop flushes the broker's buffered log lines.
    await broker.stop();
    const stages = broker
      .logs()
      .filter((l) => l.includes('the server accepted another version'))
      .map((l) => JSON.parse(l) as { client: string; stage: string })
      .map(({ client, stage }) => [client, stage])
      .sort();
    expect(stages).toEqual([
      ['pending', 'AWSPENDING'],
      ['previous', 'AWSPREVIOUS'],
    ]);
  });
});
