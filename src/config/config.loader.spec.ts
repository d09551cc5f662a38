import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigErrorCode, ConfigException } from './config.exception';
import { DEFAULT_CLIENT_ID, loadConfig } from './config.loader';
import { adminPortOf } from './http.schema';
import { redisConfigured } from './redis.schema';

/** Reading, not the production rules (config.security.spec): Redis without a cache key is fine. */
const BASE = {
  NODE_ENV: 'test',
  PROVIDER_AUTH_URL: 'https://partner.credify.tech',
  PROVIDER_BASE_URL: 'https://partner.credify.tech/',
  CREDENTIALS_SECRET_ID: 'arn:aws:secretsmanager:us-east-1:1:secret:acme',
  CALLER_AUTH_MODE: 'api-key',
  CALLER_API_KEYS_FILE: '/var/run/secrets/caller-api-keys.json',
};

function problems(env: Record<string, string | undefined>): string[] {
  try {
    loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigException) return err.problems;
    throw err;
  }
  throw new Error('expected a ConfigException');
}

function tempFile(name: string, content: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'tb-config-'));
  const file = join(dir, name);
  writeFileSync(file, content);
  return file;
}

describe(loadConfig.name, () => {
  it('builds one default client from the contract environment variables, with documented defaults', () => {
    const cfg = loadConfig(BASE);
    expect(cfg.clients).toEqual([
      {
        id: DEFAULT_CLIENT_ID,
        authUrl: 'https://partner.credify.tech',
        baseUrl: 'https://partner.credify.tech',
        ordersPath: '/api/checkout/v1/orders',
        tokenRejection: { forward: 'invalid_token' },
        credentials: { secretId: BASE.CREDENTIALS_SECRET_ID },
        tokenRequest: { grant: 'provider-query', auth: 'client_secret_basic' },
        forward: {
          allow: [
            { methods: ['POST'], path: '/api/checkout/v1/orders' },
            { methods: ['GET', 'HEAD'], prefix: '/api/marketing/v1/' },
          ],
        },
      },
    ]);
    expect(cfg.http.port).toBe(8080);
    expect(cfg.token.refreshAheadSeconds).toBe(300);
    expect(cfg.token.defaultLifetimeSeconds).toBe(1800);
    expect(cfg.token.minRefreshIntervalMs).toBe(5000);
    expect(cfg.redis.url).toBeUndefined();
    expect(cfg.http.shutdownDrainDelayMs).toBe(0);
    expect(loadConfig({ ...BASE, SHUTDOWN_DRAIN_DELAY_MS: '5000' }).http.shutdownDrainDelayMs).toBe(
      5000,
    );
  });

  it('reads every contract variable', () => {
    const cfg = loadConfig({
      ...BASE,
      CREDENTIALS_SECRET_ID: undefined,
      CREDENTIALS_FILE: '/var/run/secrets/provider.json',
      PORT: '9090',
      REDIS_URL: 'rediss://:pw@cache.example:6379/0',
      PROVIDER_ORDERS_PATH: '/api/flexpay/v1/orders',
      TOKEN_REFRESH_AHEAD_SECONDS: '120',
      TOKEN_DEFAULT_LIFETIME_SECONDS: '900',
      TOKEN_MIN_REFRESH_INTERVAL_MS: '10000',
    });
    expect(cfg.token.minRefreshIntervalMs).toBe(10_000);
    expect(cfg.http.port).toBe(9090);
    expect(cfg.redis.url).toBe('rediss://:pw@cache.example:6379/0');
    expect(cfg.clients[0].ordersPath).toBe('/api/flexpay/v1/orders');
    expect(cfg.clients[0].credentials).toEqual({ file: '/var/run/secrets/provider.json' });
    expect(cfg.token.refreshAheadSeconds).toBe(120);
    expect(cfg.token.defaultLifetimeSeconds).toBe(900);
  });

  it.each([
    [{ PORT: 'eighty' }, 'PORT: Invalid input: expected number'],
    [{ PORT: '70000' }, 'PORT'],
    [{ PROVIDER_AUTH_URL: 'partner.credify.tech' }, 'PROVIDER_AUTH_URL'],
    [{ PROVIDER_BASE_URL: 'ftp://x' }, 'PROVIDER_BASE_URL'],
    [{ PROVIDER_ORDERS_PATH: 'orders' }, 'PROVIDER_ORDERS_PATH'],
    [{ REDIS_URL: 'http://cache:6379' }, 'REDIS_URL'],
    [{ TOKEN_REFRESH_AHEAD_SECONDS: '-1' }, 'TOKEN_REFRESH_AHEAD_SECONDS'],
    [{ TOKEN_DEFAULT_LIFETIME_SECONDS: '1.5' }, 'TOKEN_DEFAULT_LIFETIME_SECONDS'],
    [{ TOKEN_REFRESH_AHEAD_SECONDS: '2000' }, 'TOKEN_REFRESH_AHEAD_SECONDS'],
    [{ LOG_LEVEL: 'loud' }, 'LOG_LEVEL'],
    [{ TOKEN_MIN_REFRESH_INTERVAL_MS: 'soon' }, 'TOKEN_MIN_REFRESH_INTERVAL_MS'],
    [{ TOKEN_MIN_REFRESH_INTERVAL_MS: '50' }, 'TOKEN_MIN_REFRESH_INTERVAL_MS'],
    [{ TOKEN_MIN_REFRESH_INTERVAL_MS: '600001' }, 'TOKEN_MIN_REFRESH_INTERVAL_MS'],
    [
      { TOKEN_MIN_REFRESH_INTERVAL_MS: '60000', TOKEN_DEFAULT_LIFETIME_SECONDS: '60' },
      'TOKEN_MIN_REFRESH_INTERVAL_MS: must be at least 1 s shorter than token.defaultLifetimeSeconds',
    ],
    [{ PROVIDER_AUTH_URL: undefined }, 'PROVIDER_AUTH_URL: required'],
    [{ CREDENTIALS_SECRET_ID: undefined }, 'CREDENTIALS_SECRET_ID or CREDENTIALS_FILE'],
    [{ CREDENTIALS_FILE: '/x.json' }, 'CREDENTIALS_SECRET_ID or CREDENTIALS_FILE'],
    [{ CLIENT_ID: 'Acme Prod' }, 'CLIENT_ID'],
    [{ SHUTDOWN_DRAIN_DELAY_MS: '-5' }, 'SHUTDOWN_DRAIN_DELAY_MS'],
    [{ SHUTDOWN_DRAIN_DELAY_MS: '200000' }, 'SHUTDOWN_DRAIN_DELAY_MS'],
    [{ AUDIT_INTERVAL_SECONDS: '0' }, 'AUDIT_INTERVAL_SECONDS'],
    [{ AUDIT_PER_REQUEST: 'sometimes' }, 'AUDIT_PER_REQUEST'],
    [{ AUDIT_REFUSALS_PER_SECOND: '-1' }, 'AUDIT_REFUSALS_PER_SECOND'],
  ])('names the bad setting for %j', (override, expected) => {
    const found = problems({ ...BASE, ...override });
    expect(found.join('\n')).toContain(expected);
  });

  it("reads the private_key_jwt assertion's lifetime, naming its variable when out of range", () => {
    const jwt = {
      ...BASE,
      TOKEN_REQUEST_GRANT: 'rfc6749',
      TOKEN_REQUEST_URL: 'https://auth.example.com/token',
      TOKEN_REQUEST_AUTH: 'private_key_jwt',
    };
    expect(
      loadConfig({ ...jwt, TOKEN_REQUEST_ASSERTION_LIFETIME_SECONDS: '120' }).clients[0]
        .tokenRequest.assertion,
    ).toEqual({ alg: 'RS256', audience: 'token_endpoint', lifetimeSeconds: 120 });
    expect(problems({ ...jwt, TOKEN_REQUEST_ASSERTION_LIFETIME_SECONDS: '3600' })).toEqual([
      expect.stringMatching(/^TOKEN_REQUEST_ASSERTION_LIFETIME_SECONDS: /),
    ]);
  });

  it('reads the audit trail settings, with their defaults', () => {
    expect(loadConfig(BASE).audit).toEqual({
      intervalSeconds: 10,
      perRequest: false,
      refusalsPerSecond: 100,
    });
    expect(
      loadConfig({
        ...BASE,
        AUDIT_INTERVAL_SECONDS: '60',
        AUDIT_PER_REQUEST: 'true',
        AUDIT_REFUSALS_PER_SECOND: '5',
      }).audit,
    ).toEqual({ intervalSeconds: 60, perRequest: true, refusalsPerSecond: 5 });
  });

  it("reads the passthrough's idempotency TTL and per-caller bound, shorter than the orders TTL by default", () => {
    const defaults = loadConfig(BASE);
    expect(defaults.forward).toMatchObject({
      idempotencyTtlSeconds: 3600,
      maxIdempotencyRecordsPerCaller: 10_000,
    });
    expect(defaults.orders.idempotencyTtlSeconds).toBe(86_400);
    expect(
      loadConfig({
        ...BASE,
        FORWARD_IDEMPOTENCY_TTL_SECONDS: '600',
        FORWARD_IDEMPOTENCY_MAX_RECORDS_PER_CALLER: '0',
      }).forward,
    ).toMatchObject({ idempotencyTtlSeconds: 600, maxIdempotencyRecordsPerCaller: 0 });
    expect(problems({ ...BASE, FORWARD_IDEMPOTENCY_TTL_SECONDS: '5' })).toEqual([
      expect.stringContaining('FORWARD_IDEMPOTENCY_TTL_SECONDS'),
    ]);
  });

  describe('the admin port', () => {
    it('reads OAUTH_ISSUER without a trailing slash, refusing a query or fragment', () => {
      expect(loadConfig({ ...BASE, OAUTH_ISSUER: 'https://tb.example/' }).http.issuer).toBe(
        'https://tb.example',
      );
      expect(loadConfig(BASE).http.issuer).toBeUndefined();
      expect(problems({ ...BASE, OAUTH_ISSUER: 'https://tb.example/?x=1' })).toEqual([
        expect.stringMatching(/^OAUTH_ISSUER: .*query or fragment/),
      ]);
    });

    it('reads ADMIN_PORT; METRICS_PORT is its deprecated alias', () => {
      expect(adminPortOf(loadConfig({ ...BASE, ADMIN_PORT: '9090' }).http)).toBe(9090);
      expect(adminPortOf(loadConfig({ ...BASE, METRICS_PORT: '9091' }).http)).toBe(9091);
      expect(adminPortOf(loadConfig(BASE).http)).toBeUndefined();
      // Both the same: harmless, as when a deployment is half renamed.
      expect(
        adminPortOf(loadConfig({ ...BASE, ADMIN_PORT: '9090', METRICS_PORT: '9090' }).http),
      ).toBe(9090);
    });

    it.each([
      [{ ADMIN_PORT: '8080' }, 'adminPort (ADMIN_PORT) must differ from port (PORT)'],
      [{ ADMIN_PORT: '9090', METRICS_PORT: '9091' }, 'set ADMIN_PORT only'],
      [{ ADMIN_PORT: '70000' }, 'ADMIN_PORT'],
    ])('refuses %j', (override, expected) => {
      expect(problems({ ...BASE, ...override }).join('\n')).toContain(expected);
    });
  });

  it('never prints the offending value', () => {
    const secretish = 'sk_live_DO_NOT_PRINT_ME';
    const found = problems({
      ...BASE,
      REDIS_URL: secretish,
      PORT: secretish,
      PROVIDER_AUTH_URL: secretish,
    });
    expect(found).toHaveLength(3);
    expect(found.join('\n')).not.toContain(secretish);
  });

  it('reads many clients from a YAML file, env overriding scalar settings', () => {
    const file = tempFile(
      'broker.yaml',
      [
        'token: { refreshAheadSeconds: 60 }',
        'clients:',
        '  - id: acme-preprod',
        '    authUrl: https://partner.credify.tech',
        '    baseUrl: https://partner.credify.tech',
        '    credentials: { secretId: acme-preprod }',
        '  - id: acme-prod',
        '    authUrl: https://partner.upgrade.com',
        '    baseUrl: https://partner.upgrade.com',
        '    ordersPath: /api/flexpay/v1/orders',
        '    credentials: { file: /mnt/secrets/acme-prod.json }',
      ].join('\n'),
    );
    const cfg = loadConfig({
      BROKER_CONFIG_FILE: file,
      TOKEN_REFRESH_AHEAD_SECONDS: '90',
      CALLER_AUTH_MODE: 'api-key',
      CALLER_API_KEYS_SECRET_ID: 'token-broker/caller-api-keys',
    });
    expect(cfg.clients.map((c) => c.id)).toEqual(['acme-preprod', 'acme-prod']);
    expect(cfg.clients[1].ordersPath).toBe('/api/flexpay/v1/orders');
    expect(cfg.token.refreshAheadSeconds).toBe(90);
  });

  it('reads JSON files too, and names file settings by path', () => {
    const file = tempFile(
      'broker.json',
      JSON.stringify({
        clients: [
          { id: 'a', authUrl: 'https://a', baseUrl: 'https://a', credentials: { file: '/a' } },
          { id: 'a', authUrl: 'nope', baseUrl: 'https://a', credentials: {} },
        ],
      }),
    );
    const found = problems({ BROKER_CONFIG_FILE: file });
    expect(found).toEqual(
      expect.arrayContaining([
        `${file}: clients[1].id: duplicate client id`,
        expect.stringContaining(`${file}: clients[1].authUrl:`),
        `${file}: clients[1].credentials: set exactly one of secretId or file (the credentials JSON), or privateKeyFile with clientId (key files)`,
      ]),
    );
  });

  it('refuses clients defined in both the file and the environment', () => {
    const file = tempFile(
      'b.yaml',
      'clients: [{id: a, authUrl: "https://a", baseUrl: "https://a", credentials: {file: /a}}]',
    );
    expect(problems({ ...BASE, BROKER_CONFIG_FILE: file }).join()).toMatch(
      /PROVIDER_AUTH_URL.*one place/,
    );
  });

  it('refuses unknown keys in the file (a typo must not silently fall back to a default)', () => {
    const file = tempFile(
      'b.yaml',
      'tokn: {refreshAheadSeconds: 5}\nclients: [{id: a, authUrl: "https://a", baseUrl: "https://a", credentials: {file: /a}}]',
    );
    expect(problems({ BROKER_CONFIG_FILE: file }).join()).toMatch(/tokn/);
  });

  it('names an unknown key only when it looks like a setting name (a pasted secret stays off stderr)', () => {
    const pasted = 'ghp_4f9Qz7LkX2vB8nR1tY6wE3mA0sD5cH9jK2pL';
    const file = tempFile(
      'b.yaml',
      [
        'tokn: {refreshAheadSeconds: 5}',
        `${pasted}: true`,
        '"client_secret: s3cr3t-DO-NOT-PRINT": 1',
        'clients: [{id: a, authUrl: "https://a", baseUrl: "https://a", credentials: {file: /a}}]',
      ].join('\n'),
    );
    const found = problems({
      ...BASE,
      BROKER_CONFIG_FILE: file,
      PROVIDER_AUTH_URL: undefined,
      PROVIDER_BASE_URL: undefined,
      CREDENTIALS_SECRET_ID: undefined,
    });
    expect(found).toEqual([
      `${file}: unknown keys "tokn", 2 unknown keys (not shown); check the spelling against docs/configuration.md`,
    ]);
    expect(found.join('\n')).not.toMatch(/ghp_|s3cr3t/);
    const one = tempFile(
      'c.yaml',
      `${pasted}: 1\nclients: [{id: a, authUrl: "https://a", baseUrl: "https://a", credentials: {file: /a}}]`,
    );
    expect(
      problems({
        ...BASE,
        BROKER_CONFIG_FILE: one,
        PROVIDER_AUTH_URL: undefined,
        PROVIDER_BASE_URL: undefined,
        CREDENTIALS_SECRET_ID: undefined,
      }),
    ).toEqual([
      `${one}: unknown key an unknown key (not shown); check the spelling against docs/configuration.md`,
    ]);
  });

  describe('settings that name a secret', () => {
    it.each([
      ['CREDENTIALS_SECRET_ID', '{"client_id":"acme","client_secret":"s3cr3t-DO-NOT-PRINT"}'],
      ['CREDENTIALS_SECRET_ID', 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:a b'],
      ['CREDENTIALS_FILE', '-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n'],
      ['CALLER_API_KEYS_SECRET_ID', 'hunter2 DO-NOT-PRINT'],
      ['CACHE_KEY_FILE', '{"current":"s3cr3t-DO-NOT-PRINT"}'],
      ['REDIS_PASSWORD_SECRET_ID', 'p@ss word!'],
    ])('refuses a %s that is not shaped like a reference, unprinted', (name, value) => {
      // The setting's sibling (a secret id or a file for the same thing) is left unset.
      const found = problems({
        ...BASE,
        CREDENTIALS_SECRET_ID: undefined,
        CREDENTIALS_FILE: name.startsWith('CREDENTIALS_') ? undefined : '/run/provider.json',
        CALLER_API_KEYS_FILE: name.startsWith('CALLER_API_KEYS_') ? undefined : '/run/keys.json',
        REDIS_URL: 'redis://cache:6379',
        [name]: value,
      });
      expect(found).toEqual([
        expect.stringMatching(
          new RegExp(`^${name}: must be a (Secrets Manager secret name|file path)`),
        ),
      ]);
      expect(found.join('\n')).not.toContain(value);
      expect(found.join('\n')).not.toMatch(/DO-NOT-PRINT|MIIEv|p@ss|secret:a b/);
    });

    it('accepts secret names, ARNs and paths as they are written', () => {
      const cfg = loadConfig({
        ...BASE,
        CREDENTIALS_SECRET_ID:
          'arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:tb/acme-prod-AbCdEf',
        CACHE_KEY_FILE: '/mnt/secrets-store/token broker/cache-key',
      });
      expect(cfg.clients[0].credentials.secretId).toMatch(/AbCdEf$/);
      expect(cfg.cacheEncryption.key).toEqual({
        file: '/mnt/secrets-store/token broker/cache-key',
      });
    });
  });

  it('refuses a user name or password in the provider URLs, naming the setting, never the password', () => {
    const password = 'hunter2-DO-NOT-PRINT';
    const withUser = `https://svc:${password}@partner.credify.tech`;
    const found = problems({ ...BASE, PROVIDER_AUTH_URL: withUser, PROVIDER_BASE_URL: withUser });
    expect(found).toEqual([
      expect.stringMatching(/^PROVIDER_AUTH_URL: must not hold a user name or password/),
      expect.stringMatching(/^PROVIDER_BASE_URL: must not hold a user name or password/),
    ]);
    const file = tempFile(
      'b.json',
      JSON.stringify({
        clients: [
          { id: 'a', authUrl: 'https://a', baseUrl: withUser, credentials: { file: '/a' } },
        ],
      }),
    );
    const fromFile = problems({
      BROKER_CONFIG_FILE: file,
      CALLER_AUTH_MODE: 'api-key',
      CALLER_API_KEYS_FILE: '/k',
    });
    expect(fromFile).toEqual([expect.stringContaining(`${file}: clients[0].baseUrl: must not`)]);
    const userOnly = problems({
      ...BASE,
      PROVIDER_BASE_URL: `https://${password}@partner.credify.tech`,
    });
    expect(userOnly).toEqual([expect.stringMatching(/^PROVIDER_BASE_URL: must not/)]);
    expect([...found, ...fromFile, ...userOnly].join()).not.toContain(password);
  });

  it('trims trailing slashes from a URL in time linear in its length', () => {
    // A regex like /\/+$/ retries from every slash of a run that is not at the end.
    const slashes = '/'.repeat(50_000);
    const started = performance.now();
    const cfg = loadConfig({
      ...BASE,
      PROVIDER_AUTH_URL: `https://a/${slashes}x${slashes}`,
      PROVIDER_BASE_URL: `https://b/${slashes}x`,
    });
    expect(performance.now() - started).toBeLessThan(250);
    expect(cfg.clients[0].authUrl).toBe(`https://a/${slashes}x`);
    expect(cfg.clients[0].baseUrl).toBe(`https://b/${slashes}x`);
  });

  it('refuses a config file over 1 MiB with a config error', () => {
    const file = tempFile('big.yaml', `# ${'x'.repeat(1024 * 1024)}\nclients: []\n`);
    let thrown: unknown;
    try {
      loadConfig({ BROKER_CONFIG_FILE: file });
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(ConfigException);
    expect((thrown as ConfigException).code).toBe(ConfigErrorCode.FileUnreadable);
    expect((thrown as ConfigException).problems).toEqual([
      expect.stringMatching(/^BROKER_CONFIG_FILE: the file is over 1048576 bytes/),
    ]);
  });

  describe('redis', () => {
    it('defaults to standalone without a URL: no Redis, the in-memory stores', () => {
      const { redis } = loadConfig(BASE);
      expect(redis.mode).toBe('standalone');
      expect(redisConfigured(redis)).toBe(false);
      expect(redis.tls).toEqual({ enabled: false });
      expect(redis.sentinel).toEqual({});
      expect(redis.cluster).toEqual({});
    });

    it('reads a standalone URL with ACL user, password file and TLS settings', () => {
      const { redis } = loadConfig({
        ...BASE,
        REDIS_URL: 'redis://primary.cache.example:6379',
        REDIS_USERNAME: 'token-broker',
        REDIS_PASSWORD_FILE: '/var/run/secrets/redis/password',
        REDIS_TLS: 'true',
        REDIS_TLS_CA_FILE: '/etc/redis-ca/ca.crt',
        REDIS_TLS_CERT_FILE: '/etc/redis-client/tls.crt',
        REDIS_TLS_KEY_FILE: '/etc/redis-client/tls.key',
        REDIS_TLS_SERVER_NAME: 'cache.example',
      });
      expect(redisConfigured(redis)).toBe(true);
      expect(redis.username).toBe('token-broker');
      expect(redis.password).toEqual({ file: '/var/run/secrets/redis/password' });
      expect(redis.tls).toEqual({
        enabled: true,
        caFile: '/etc/redis-ca/ca.crt',
        certFile: '/etc/redis-client/tls.crt',
        keyFile: '/etc/redis-client/tls.key',
        serverName: 'cache.example',
      });
    });

    it('turns TLS on for a rediss:// URL', () => {
      const { redis } = loadConfig({ ...BASE, REDIS_URL: 'rediss://primary.cache.example:6379' });
      expect(redis.tls.enabled).toBe(true);
    });

    it('reads Sentinel: comma-separated nodes, master name, sentinel auth from a secret', () => {
      const { redis } = loadConfig({
        ...BASE,
        REDIS_MODE: 'sentinel',
        REDIS_SENTINELS: 'sentinel-0.redis:26379, sentinel-1.redis:26379,[::1]:26379',
        REDIS_SENTINEL_MASTER: 'mymaster',
        REDIS_SENTINEL_USERNAME: 'sentinel-user',
        REDIS_SENTINEL_PASSWORD_SECRET_ID: 'redis/sentinel',
        REDIS_PASSWORD_SECRET_ID: 'redis/data',
      });
      expect(redisConfigured(redis)).toBe(true);
      expect(redis.sentinel).toEqual({
        nodes: ['sentinel-0.redis:26379', 'sentinel-1.redis:26379', '[::1]:26379'],
        masterName: 'mymaster',
        username: 'sentinel-user',
        password: { secretId: 'redis/sentinel' },
      });
      expect(redis.password).toEqual({ secretId: 'redis/data' });
    });

    it('reads Cluster seed nodes or a configuration endpoint', () => {
      const { redis } = loadConfig({
        ...BASE,
        REDIS_MODE: 'cluster',
        REDIS_CLUSTER_NODES: 'clustercfg.tb.abc123.use1.cache.amazonaws.com:6379',
      });
      expect(redisConfigured(redis)).toBe(true);
      expect(redis.cluster.nodes).toEqual(['clustercfg.tb.abc123.use1.cache.amazonaws.com:6379']);
    });

    it.each([
      [{ REDIS_MODE: 'replicated' }, 'REDIS_MODE: Invalid option'],
      [{ REDIS_MODE: 'sentinel' }, 'REDIS_SENTINELS: required in mode "sentinel"'],
      [
        { REDIS_MODE: 'sentinel', REDIS_SENTINELS: 's:26379' },
        'REDIS_SENTINEL_MASTER: required in mode "sentinel"',
      ],
      [{ REDIS_MODE: 'cluster' }, 'REDIS_CLUSTER_NODES: required in mode "cluster"'],
      [
        { REDIS_MODE: 'cluster', REDIS_CLUSTER_NODES: 'c:6379', REDIS_URL: 'redis://c:6379' },
        'REDIS_URL: only in mode "standalone"',
      ],
      [
        { REDIS_SENTINELS: 's:26379', REDIS_URL: 'redis://c:6379' },
        'REDIS_SENTINELS: only in mode "sentinel"',
      ],
      [{ REDIS_CLUSTER_NODES: 'c:6379' }, 'REDIS_CLUSTER_NODES: only in mode "cluster"'],
      [
        { REDIS_MODE: 'cluster', REDIS_CLUSTER_NODES: 'no-port' },
        'REDIS_CLUSTER_NODES: must be host:port',
      ],
      [
        { REDIS_MODE: 'cluster', REDIS_CLUSTER_NODES: 'c:70000' },
        'REDIS_CLUSTER_NODES: port must be 1-65535',
      ],
      [
        { REDIS_URL: 'rediss://c:6379', REDIS_TLS_CERT_FILE: '/c.crt' },
        'REDIS_TLS_KEY_FILE: set the client certificate and its key together',
      ],
      [
        { REDIS_URL: 'rediss://c:6379', REDIS_TLS_KEY_FILE: '/c.key' },
        'REDIS_TLS_CERT_FILE: set the client certificate and its key together',
      ],
      [
        { REDIS_URL: 'redis://c:6379', REDIS_TLS_CA_FILE: '/ca.crt' },
        'REDIS_TLS_CA_FILE: has no effect without TLS',
      ],
      [{ REDIS_PASSWORD_FILE: '/p' }, 'REDIS_PASSWORD_FILE: set only with a Redis'],
      [
        { REDIS_URL: 'redis://c:6379', REDIS_PASSWORD_FILE: '/p', REDIS_PASSWORD_SECRET_ID: 'p' },
        'REDIS_PASSWORD_SECRET_ID, REDIS_PASSWORD_FILE: set exactly one of secretId or file',
      ],
      [{ REDIS_URL: 'redis://c:6379', REDIS_TLS: 'maybe' }, 'REDIS_TLS'],
    ])('names the bad Redis setting for %j', (override, expected) => {
      expect(problems({ ...BASE, ...override }).join('\n')).toContain(expected);
    });

    it('reads the same settings from the config file', () => {
      const file = tempFile(
        'redis.yaml',
        [
          'redis:',
          '  mode: sentinel',
          '  sentinel:',
          '    nodes: ["s0:26379", "s1:26379"]',
          '    masterName: mymaster',
          '    password: { file: /mnt/sentinel-password }',
          '  password: { secretId: redis/data }',
          '  tls: { enabled: true, caFile: /mnt/ca.crt }',
        ].join('\n'),
      );
      const { redis } = loadConfig({ ...BASE, BROKER_CONFIG_FILE: file });
      expect(redis.sentinel.nodes).toEqual(['s0:26379', 's1:26379']);
      expect(redis.tls).toEqual({ enabled: true, caFile: '/mnt/ca.crt' });
    });
  });

  it.each([
    ['a missing file', '/nonexistent/broker.yaml', ConfigErrorCode.FileUnreadable],
    [
      'an unparsable file',
      tempFile('bad.yaml', 'clients: [unclosed'),
      ConfigErrorCode.FileUnparsable,
    ],
    ['a scalar file', tempFile('scalar.yaml', '42'), ConfigErrorCode.FileUnparsable],
  ])('reports %s against BROKER_CONFIG_FILE', (_label, file, code) => {
    try {
      loadConfig({ BROKER_CONFIG_FILE: file });
      throw new Error('expected a ConfigException');
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigException);
      expect((err as ConfigException).code).toBe(code);
      expect((err as ConfigException).message).toContain('BROKER_CONFIG_FILE');
    }
  });
});
