import { readFileSync, writeFileSync } from 'node:fs';
import { type RedisTopology, startTopology } from './support/redis/topology';
import { type Stack, type StackBroker, startStack } from './support/stack';
import { waitFor } from './support/wait';

const ADMIN_KEY = 'reload-admin-key-0123456789abcdef0123456789';
const CALLER_KEY = 'reload-caller-key-0123456789abcdef012345678';
/** A caller of every client (`"*"`): it learns that a client is not configured (404). */
const PLATFORM_KEY = 'reload-platform-key-0123456789abcdef0123456';

interface ClientEntry {
  id: string;
  [key: string]: unknown;
}
interface ConfigFile {
  clients: ClientEntry[];
  callerAuth: { apiKeys: { name: string; clients: string[] }[] };
  readiness?: { requiredClients: string[] };
}

/**
 * Clients added, changed and removed by reloading the configuration, on two broker processes
 * sharing one Redis: by the admin route (which reaches the other replica through Redis) and by
 * a changed mounted file (`CONFIG_RELOAD_SECONDS`), with a bad file refused as a whole.
 */
describe('clients added or removed without a restart (2 replicas)', () => {
  let topology: RedisTopology;
  let stack: Stack;
  let brokers: StackBroker[];
  /** The config the stack wrote, with every client the provider knows. */
  let full: ConfigFile;

  const writeConfig = (config: ConfigFile) =>
    writeFileSync(stack.configFile, JSON.stringify(config));
  const withClients = (ids: string[], callerClients: string[]): ConfigFile => ({
    ...full,
    clients: full.clients.filter((c) => ids.includes(c.id)),
    callerAuth: {
      ...full.callerAuth,
      apiKeys: full.callerAuth.apiKeys.map((k) =>
        k.name === 'checkout' ? { ...k, clients: callerClients } : k,
      ),
    },
  });
  const token = (b: StackBroker, client: string, key = CALLER_KEY) =>
    fetch(`${b.url}/token?client=${client}`, {
      headers: { authorization: `Bearer ${key}` },
    });
  const reload = async (b: StackBroker) => {
    const res = await fetch(`${b.adminUrl}/admin/reload`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_KEY}` },
    });
    expect(res.status).toBe(200);
    return (await res.json()) as { clients: Record<string, unknown> };
  };

  beforeAll(async () => {
    topology = await startTopology('standalone');
    stack = await startStack({
      name: 'reload',
      clients: ['acme-prod', 'globex-prod', 'initech-prod'],
      redis: topology,
      replicas: 0,
      admin: true,
      callerAuth: {
        mode: 'api-key',
        callers: {
          oncall: { clients: ['*'], scopes: ['admin'], key: ADMIN_KEY },
          checkout: { clients: ['acme-prod', 'globex-prod'], key: CALLER_KEY },
          platform: { clients: ['*'], key: PLATFORM_KEY },
        },
      },
      env: { LOG_LEVEL: 'info', CONFIG_RELOAD_SECONDS: '1' },
    });
    full = JSON.parse(readFileSync(stack.configFile, 'utf8')) as ConfigFile;
    // The replicas start with two clients; the provider knows the third already.
    writeConfig(withClients(['acme-prod', 'globex-prod'], ['acme-prod', 'globex-prod']));
    // The first replica reloads on the admin route only, so its answers are its own doing;
    // the second also watches the file.
    brokers = [
      await stack.addBroker({ env: { CONFIG_RELOAD_SECONDS: '0' } }),
      await stack.addBroker(),
    ];
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
    await topology?.stop();
  });

  it('adds a client by the admin route, on every replica, and serves it', async () => {
    for (const b of brokers) {
      expect((await token(b, 'initech-prod', PLATFORM_KEY)).status).toBe(404);
      // Granted in the file with the client: the grant follows the reload too.
      expect((await token(b, 'initech-prod')).status).toBe(403);
    }
    writeConfig(
      withClients(
        ['acme-prod', 'globex-prod', 'initech-prod'],
        ['acme-prod', 'globex-prod', 'initech-prod'],
      ),
    );
    const answer = await reload(brokers[0]);
    expect(answer.clients).toEqual({ added: ['initech-prod'], removed: [], changed: [] });
    const res = await token(brokers[0], 'initech-prod');
    expect(res.status).toBe(200);
    // The other replica heard the request through Redis (or saw the file change itself).
    await waitFor(async () => (await token(brokers[1], 'initech-prod')).status === 200, {
      timeoutMs: 10_000,
      what: 'the second replica to serve the added client',
    });
    // One token for the fleet: the second replica adopted the first one's.
    const tokens = stack.provider.stats.issued.filter((g) => g.clientId === 'initech-merchant');
    expect(tokens).toHaveLength(1);
  });

  it('removes a client when the mounted file changes: it answers unknown_client and its series go', async () => {
    const watching = brokers[1];
    const before = await (await fetch(`${watching.adminUrl}/metrics`)).text();
    expect(before).toContain('client="globex-prod"');
    writeConfig(withClients(['acme-prod', 'initech-prod'], ['acme-prod', 'initech-prod']));
    await waitFor(async () => (await token(watching, 'globex-prod', PLATFORM_KEY)).status === 404, {
      timeoutMs: 10_000,
      what: 'the watching replica to drop the removed client',
    });
    const res = await token(watching, 'globex-prod', PLATFORM_KEY);
    expect(((await res.json()) as { code: string }).code).toBe('unknown_client');
    // Its grant went with it.
    expect((await token(watching, 'globex-prod')).status).toBe(403);
    expect((await token(watching, 'acme-prod')).status).toBe(200);
    const metrics = await (await fetch(`${watching.adminUrl}/metrics`)).text();
    expect(metrics).not.toContain('client="globex-prod"');
    // Logged (the lines reach stdout within 200 ms).
    await waitFor(
      () =>
        watching
          .logs()
          .some(
            (l) =>
              l.includes('configuration file changed') && l.includes('"removed":["globex-prod"]'),
          ),
      { timeoutMs: 3000, what: 'the reload to be logged' },
    );
    // The replica that does not watch the file still serves it, until reloaded.
    expect((await token(brokers[0], 'globex-prod', PLATFORM_KEY)).status).toBe(200);
    expect((await reload(brokers[0])).clients).toEqual({
      added: [],
      removed: ['globex-prod'],
      changed: [],
    });
    expect((await token(brokers[0], 'globex-prod', PLATFORM_KEY)).status).toBe(404);
  });

  it('refuses a bad file as a whole and keeps the running clients', async () => {
    // Valid JSON, but the readiness list names a client that is not configured.
    writeConfig({
      ...withClients(['acme-prod'], ['acme-prod']),
      readiness: { requiredClients: ['globex-prod'] },
    });
    const answer = await reload(brokers[0]);
    expect(answer.clients).toEqual({ error: expect.stringContaining('readiness') as string });
    // Not even the removal of initech-prod was applied.
    for (const b of brokers) {
      expect((await token(b, 'initech-prod')).status).toBe(200);
      expect((await token(b, 'acme-prod')).status).toBe(200);
    }
    writeFileSync(stack.configFile, '{"clients": [');
    expect((await reload(brokers[0])).clients).toEqual({
      error: expect.stringContaining('not valid YAML or JSON') as string,
    });
    expect((await token(brokers[0], 'initech-prod')).status).toBe(200);
    await waitFor(
      () =>
        brokers[0]
          .logs()
          .some(
            (l) => l.includes('the reloaded configuration is invalid') && l.includes('readiness'),
          ),
      { timeoutMs: 3000, what: 'the refusal to be logged with its reason' },
    );
  });

  it('replaces a changed client, keeping its token when only where calls go changed', async () => {
    const issued = stack.provider.stats.tokenRequests;
    const before = (await (await token(brokers[0], 'acme-prod')).json()) as {
      access_token: string;
    };
    const config = withClients(['acme-prod', 'initech-prod'], ['acme-prod', 'initech-prod']);
    config.clients = config.clients.map((c) =>
      c.id === 'acme-prod' ? { ...c, ordersPath: '/api/v2/orders' } : c,
    );
    writeConfig(config);
    expect((await reload(brokers[0])).clients).toEqual({
      added: [],
      removed: [],
      changed: ['acme-prod'],
    });
    const after = (await (await token(brokers[0], 'acme-prod')).json()) as {
      access_token: string;
    };
    expect(after.access_token).toBe(before.access_token);
    expect(stack.provider.stats.tokenRequests).toBe(issued);
  });

  it('adds a client when the mounted file changes, and serves it', async () => {
    const watching = brokers[1];
    expect((await token(watching, 'globex-prod', PLATFORM_KEY)).status).toBe(404);
    const config = withClients(
      ['acme-prod', 'globex-prod', 'initech-prod'],
      ['acme-prod', 'globex-prod', 'initech-prod'],
    );
    config.clients = config.clients.map((c) =>
      c.id === 'acme-prod' ? { ...c, ordersPath: '/api/v2/orders' } : c,
    );
    writeConfig(config);
    await waitFor(async () => (await token(watching, 'globex-prod')).status === 200, {
      timeoutMs: 10_000,
      what: 'the watching replica to serve the client the file added',
    });
  });
});
