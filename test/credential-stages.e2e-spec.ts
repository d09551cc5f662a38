import { type AuthServer, startAuthServer } from './support/auth-server';
import { type Stack, type StackBroker, startStack } from './support/stack';

const secret = (client_id: string, client_secret: string) =>
  JSON.stringify({ client_id, client_secret });

/**
 * Rotation without a failed refresh: when the authorization server (oidc-provider) refuses the
 * current version of a Secrets Manager secret, the broker tries AWSPENDING (a rotation in
 * progress: the server already has the new secret) and then AWSPREVIOUS (the server still has
 * the old one), uses the first the server accepts and logs its stage. Secrets Manager is the
 * real SDK against the project's emulator; the broker runs in the Jest process.
 */
describe('credentials rotation across Secrets Manager staging labels', () => {
  let as: AuthServer;
  let stack: Stack;
  let broker: StackBroker;

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
    // The current versions are the ones the stack keeps; the other stages are set before the
    // broker first reads them.
    const client = (id: string, client_id: string, client_secret: string, auth: string) => ({
      id,
      credentials: { client_id, client_secret },
      config: {
        authUrl: as.url,
        baseUrl: as.url,
        tokenRequest: { grant: 'rfc6749', url: as.tokenUrl, auth },
      },
    });
    stack = await startStack({
      name: 'stages',
      clients: [
        client(
          'pending',
          'shop-pending',
          'pending-old-secret-0123456789abcdef',
          'client_secret_basic',
        ),
        client(
          'previous',
          'shop-previous',
          'previous-new-secret-0123456789abcdef',
          'client_secret_post',
        ),
      ],
      secrets: 'secrets-manager',
      inProcess: true,
      replicas: 0,
      env: { LOG_LEVEL: 'info', TOKEN_REFRESH_AHEAD_SECONDS: '10' },
    });
    stack.secrets!.setSecretStage(
      'token-broker/pending',
      'AWSPENDING',
      secret('shop-pending', 'pending-new-secret-0123456789abcdef'),
    );
    stack.secrets!.setSecretStage(
      'token-broker/previous',
      'AWSPREVIOUS',
      secret('shop-previous', 'previous-old-secret-0123456789abcdef'),
    );
    broker = await stack.addBroker({ name: 'broker-stages' });
  });

  afterAll(async () => {
    await stack?.close();
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
