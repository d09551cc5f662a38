import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigException } from './config.exception';
import { loadConfig } from './config.loader';

/** A valid one-client environment, minus caller authentication. */
const CLIENT = {
  PROVIDER_AUTH_URL: 'https://partner.credify.tech',
  PROVIDER_BASE_URL: 'https://partner.credify.tech',
  CREDENTIALS_FILE: '/var/run/secrets/provider.json',
};
const API_KEYS = {
  CALLER_AUTH_MODE: 'api-key',
  CALLER_API_KEYS_FILE: '/var/run/secrets/keys.json',
};
const HASH = 'ab'.repeat(32);

function problems(env: Record<string, string | undefined>): string[] {
  try {
    loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigException) return err.problems;
    throw err;
  }
  throw new Error('expected a ConfigException');
}

function configFile(content: unknown): string {
  const file = join(mkdtempSync(join(tmpdir(), 'tb-config-')), 'broker.json');
  writeFileSync(file, JSON.stringify(content));
  return file;
}

const clients = [
  { id: 'acme-prod', authUrl: 'https://a', baseUrl: 'https://a', credentials: { file: '/a' } },
  { id: 'acme-preprod', authUrl: 'https://a', baseUrl: 'https://a', credentials: { file: '/b' } },
];

describe('caller authentication and cache encryption settings', () => {
  it('has no default mode: the operator must choose, and is told the choices', () => {
    expect(problems(CLIENT)).toEqual([
      'CALLER_AUTH_MODE: required: choose "api-key", "kubernetes", or "none" (local development only)',
    ]);
    expect(problems({ ...CLIENT, CALLER_AUTH_MODE: 'open' })).toEqual([
      'CALLER_AUTH_MODE: must be "api-key", "kubernetes" or "none"',
    ]);
  });

  it('still lists every other bad setting when the mode is missing', () => {
    const found = problems({ ...CLIENT, TOKEN_REFRESH_AHEAD_SECONDS: '5000' });
    expect(found).toEqual([
      expect.stringContaining('CALLER_AUTH_MODE: required'),
      'TOKEN_REFRESH_AHEAD_SECONDS: must be shorter than token.defaultLifetimeSeconds',
    ]);
  });

  describe('mode none', () => {
    const LOCAL = { ...CLIENT, HOST: '127.0.0.1', NODE_ENV: 'development' };

    it('needs an explicit CALLER_AUTH_ALLOW_NONE', () => {
      expect(problems({ ...LOCAL, CALLER_AUTH_MODE: 'none' })).toEqual([
        'CALLER_AUTH_ALLOW_NONE: must be true to turn caller authentication off (mode "none", local development only)',
      ]);
      const cfg = loadConfig({
        ...LOCAL,
        CALLER_AUTH_MODE: 'none',
        CALLER_AUTH_ALLOW_NONE: 'true',
      });
      expect(cfg.callerAuth).toMatchObject({ mode: 'none', allowNone: true });
    });

    it.each([
      // Unset is production: a deployment that forgets NODE_ENV fails closed.
      [undefined, 'true'],
      ['production', 'true'],
      ['production', undefined],
      ['Production', 'true'],
      ['prod', 'true'],
      ['staging', 'true'],
      [' development', 'true'],
    ])('is refused when NODE_ENV=%j, whatever the host (allow=%s)', (nodeEnv, allow) => {
      const found = problems({
        ...LOCAL,
        NODE_ENV: nodeEnv,
        CALLER_AUTH_MODE: 'none',
        CALLER_AUTH_ALLOW_NONE: allow,
      });
      expect(found).toEqual([
        'CALLER_AUTH_MODE: "none" is refused unless NODE_ENV is "development" or "test"; use "api-key" or "kubernetes"',
      ]);
    });

    it.each([undefined, '0.0.0.0', '::', '10.0.0.12', 'broker.internal', '::ffff:10.0.0.1'])(
      'refuses any non-loopback HOST (%s) whatever NODE_ENV says, naming both settings',
      (host) => {
        for (const nodeEnv of ['development', 'test']) {
          const found = problems({
            ...CLIENT,
            HOST: host,
            NODE_ENV: nodeEnv,
            CALLER_AUTH_MODE: 'none',
            CALLER_AUTH_ALLOW_NONE: 'true',
          });
          expect(found).toEqual([
            'CALLER_AUTH_MODE: "none" listens on loopback only: set HOST (http.host) to 127.0.0.1, ::1 or localhost, or use "api-key" or "kubernetes"',
          ]);
        }
      },
    );

    it.each(['127.0.0.1', '127.1.2.3', '::1', 'localhost'])(
      'accepts the loopback HOST %s',
      (host) => {
        const cfg = loadConfig({
          ...CLIENT,
          HOST: host,
          NODE_ENV: 'test',
          CALLER_AUTH_MODE: 'none',
          CALLER_AUTH_ALLOW_NONE: 'true',
        });
        expect(cfg.http.host).toBe(host);
      },
    );

    it('refuses a non-boolean allow flag', () => {
      expect(
        problems({ ...LOCAL, CALLER_AUTH_MODE: 'none', CALLER_AUTH_ALLOW_NONE: 'sure' }).join(),
      ).toContain('CALLER_AUTH_ALLOW_NONE');
    });
  });

  describe('mode api-key', () => {
    it('needs a key source, named by its variables', () => {
      expect(problems({ ...CLIENT, CALLER_AUTH_MODE: 'api-key' })).toEqual([
        'CALLER_API_KEYS_SECRET_ID or CALLER_API_KEYS_FILE: required in mode "api-key" (or list callerAuth.apiKeys in the config file)',
      ]);
      expect(loadConfig({ ...CLIENT, ...API_KEYS }).callerAuth).toMatchObject({
        mode: 'api-key',
        apiKeysSource: { file: '/var/run/secrets/keys.json' },
        apiKeysReloadSeconds: 300,
      });
      expect(
        loadConfig({ ...CLIENT, CALLER_AUTH_MODE: 'api-key', CALLER_API_KEYS_SECRET_ID: 'tb/keys' })
          .callerAuth.apiKeysSource,
      ).toEqual({ secretId: 'tb/keys' });
    });

    it('reads hashed keys from the config file, checking each grant names a configured client', () => {
      const file = configFile({
        clients,
        callerAuth: {
          mode: 'api-key',
          apiKeys: [
            { name: 'checkout', sha256: HASH.toUpperCase(), clients: ['acme-prod'] },
            { name: 'ops', sha256: 'cd'.repeat(32), clients: ['*'] },
          ],
        },
      });
      const cfg = loadConfig({ BROKER_CONFIG_FILE: file });
      expect(cfg.callerAuth.apiKeys).toEqual([
        { name: 'checkout', sha256: HASH, clients: ['acme-prod'], scopes: ['token', 'forward'] },
        { name: 'ops', sha256: 'cd'.repeat(32), clients: ['*'], scopes: ['token', 'forward'] },
      ]);

      const bad = configFile({
        clients,
        callerAuth: {
          mode: 'api-key',
          apiKeys: [
            { name: 'checkout', sha256: HASH, clients: ['globex-prod'] },
            { name: 'twice', sha256: HASH, clients: ['acme-prod'] },
            { name: 'raw', sha256: 'sk_live_RAW_KEY_PASTED_HERE', clients: ['acme-prod'] },
          ],
        },
      });
      const found = problems({ BROKER_CONFIG_FILE: bad });
      expect(found).toEqual(
        expect.arrayContaining([
          `${bad}: callerAuth.apiKeys[2].sha256: must be the 64 hex digits of the key's SHA-256, never the key itself`,
        ]),
      );
      expect(found.join('\n')).not.toContain('sk_live_RAW_KEY_PASTED_HERE');
    });

    it('names the unknown client grant and the duplicate key', () => {
      const bad = configFile({
        clients,
        callerAuth: {
          mode: 'api-key',
          apiKeys: [
            { name: 'checkout', sha256: HASH, clients: ['globex-prod'] },
            { name: 'twice', sha256: HASH, clients: ['acme-prod'] },
          ],
        },
      });
      expect(problems({ BROKER_CONFIG_FILE: bad })).toEqual([
        `${bad}: callerAuth.apiKeys[1].sha256: the same key is listed twice`,
        `${bad}: callerAuth.apiKeys[0].clients[0]: not a configured client id`,
      ]);
      const unknown = configFile({
        clients,
        callerAuth: {
          mode: 'api-key',
          apiKeys: [{ name: 'c', sha256: HASH, clients: ['globex-prod'] }],
        },
      });
      expect(problems({ BROKER_CONFIG_FILE: unknown })).toEqual([
        `${unknown}: callerAuth.apiKeys[0].clients[0]: not a configured client id`,
      ]);
    });

    it('refuses the hash of an empty key (the recipe run with $key unset), naming the entry, not the hash', () => {
      const empty = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';
      const file = configFile({
        clients,
        callerAuth: {
          mode: 'api-key',
          apiKeys: [
            { name: 'checkout', sha256: HASH, clients: ['acme-prod'] },
            { name: 'billing', sha256: empty.toUpperCase(), clients: ['acme-prod'] },
          ],
        },
      });
      const found = problems({ BROKER_CONFIG_FILE: file });
      expect(found).toEqual([
        `${file}: callerAuth.apiKeys[1].sha256: is the SHA-256 of an empty key (the key variable was empty when it was hashed); generate a key with \`openssl rand -hex 32\` and hash that`,
      ]);
      expect(found.join('\n').toLowerCase()).not.toContain(empty);
    });
  });

  describe('mode kubernetes', () => {
    const K8S = {
      CALLER_AUTH_MODE: 'kubernetes',
      CALLER_AUTH_JWKS_URL: 'https://oidc.eks.eu-west-1.amazonaws.com/id/ABC/keys',
      CALLER_AUTH_ISSUER: 'https://oidc.eks.eu-west-1.amazonaws.com/id/ABC',
      CALLER_AUTH_SUBJECTS: JSON.stringify({
        'system:serviceaccount:shop:checkout': { clients: ['default'], scopes: ['forward'] },
        'system:serviceaccount:shop:billing': ['default'],
      }),
    };

    it('needs the JWKS URL, the issuer and at least one subject, each named', () => {
      expect(problems({ ...CLIENT, CALLER_AUTH_MODE: 'kubernetes' })).toEqual([
        'CALLER_AUTH_JWKS_URL: required in mode "kubernetes"',
        'CALLER_AUTH_ISSUER: required in mode "kubernetes"',
        'CALLER_AUTH_SUBJECTS: grant at least one service account in mode "kubernetes"',
      ]);
    });

    it('reads CALLER_AUTH_SUBJECTS in the JSON form the README documents, granting only the clients named', () => {
      const cfg = loadConfig({ ...CLIENT, ...K8S, CALLER_AUTH_AUDIENCE: 'broker.acme' });
      expect(cfg.callerAuth.kubernetes).toEqual({
        jwksUrl: K8S.CALLER_AUTH_JWKS_URL,
        issuer: K8S.CALLER_AUTH_ISSUER,
        audience: 'broker.acme',
        subjects: {
          'system:serviceaccount:shop:checkout': { clients: ['default'], scopes: ['forward'] },
          'system:serviceaccount:shop:billing': {
            clients: ['default'],
            scopes: ['token', 'forward'],
          },
        },
        cacheSize: 10_000,
        clockToleranceSeconds: 5,
        maxTokenLifetimeSeconds: 172_800,
      });
      expect(
        loadConfig({ ...CLIENT, ...K8S, CALLER_AUTH_MAX_TOKEN_LIFETIME_SECONDS: '7200' }).callerAuth
          .kubernetes.maxTokenLifetimeSeconds,
      ).toBe(7200);
      expect(loadConfig({ ...CLIENT, ...K8S }).callerAuth.kubernetes.audience).toBe('token-broker');
    });

    it('never widens a grant: a comma list of subjects, or a subject without clients, is refused', () => {
      const subjects = (value: string) =>
        problems({ ...CLIENT, ...K8S, CALLER_AUTH_SUBJECTS: value });
      expect(subjects('system:serviceaccount:shop:checkout, system:serviceaccount:shop:b')).toEqual(
        [
          'CALLER_AUTH_SUBJECTS: must be a JSON object granting each service account its clients, e.g. {"system:serviceaccount:<namespace>:<name>": {"clients": ["<client id>"], "scopes": ["token"]}} (a list of subjects alone names no clients)',
        ],
      );
      expect(subjects('{"system:serviceaccount:shop:checkout": ')).toEqual([
        expect.stringMatching(/^CALLER_AUTH_SUBJECTS: must be valid JSON, e\.g\. /),
      ]);
      const withoutClients = [
        { 'system:serviceaccount:shop:checkout': { scopes: ['token'] } },
        { 'system:serviceaccount:shop:checkout': { clients: [] } },
        { 'system:serviceaccount:shop:checkout': [] },
      ];
      for (const grant of withoutClients) {
        const found = subjects(JSON.stringify(grant));
        expect(found).toHaveLength(1);
        expect(found[0]).toMatch(/^CALLER_AUTH_SUBJECTS: (required|grant at least one client)/);
      }
    });

    it('maps subjects to clients from the config file, and refuses malformed subjects', () => {
      const file = configFile({
        clients,
        callerAuth: {
          mode: 'kubernetes',
          kubernetes: {
            jwksUrl: 'https://kubernetes.default.svc/openid/v1/jwks',
            issuer: 'https://kubernetes.default.svc.cluster.local',
            subjects: {
              'system:serviceaccount:shop:checkout': ['acme-prod'],
              'shop/checkout': ['acme-prod'],
              'system:serviceaccount:shop:billing': ['globex'],
            },
          },
        },
      });
      expect(problems({ BROKER_CONFIG_FILE: file })).toEqual([
        `${file}: callerAuth.kubernetes.subjects.shop/checkout: must be system:serviceaccount:<namespace>:<name>`,
        `${file}: callerAuth.kubernetes.subjects.system:serviceaccount:shop:billing[0]: not a configured client id`,
      ]);
    });

    it('reads scopes per subject (proxy-only, admin), defaulting to token and forward, and names a bad one', () => {
      const kubernetes = (subjects: Record<string, unknown>) =>
        configFile({
          clients,
          callerAuth: {
            mode: 'kubernetes',
            kubernetes: {
              jwksUrl: 'https://kubernetes.default.svc/openid/v1/jwks',
              issuer: 'https://kubernetes.default.svc.cluster.local',
              subjects,
            },
          },
        });
      const file = kubernetes({
        'system:serviceaccount:shop:checkout': { clients: ['acme-prod'], scopes: ['forward'] },
        'system:serviceaccount:ops:oncall': { clients: ['*'], scopes: ['admin', 'admin'] },
        'system:serviceaccount:shop:billing': ['acme-prod'],
      });
      expect(loadConfig({ BROKER_CONFIG_FILE: file }).callerAuth.kubernetes.subjects).toEqual({
        'system:serviceaccount:shop:checkout': { clients: ['acme-prod'], scopes: ['forward'] },
        'system:serviceaccount:ops:oncall': { clients: ['*'], scopes: ['admin'] },
        'system:serviceaccount:shop:billing': {
          clients: ['acme-prod'],
          scopes: ['token', 'forward'],
        },
      });
      const bad = kubernetes({
        'system:serviceaccount:shop:checkout': { clients: ['acme-prod'], scopes: ['read'] },
        'system:serviceaccount:shop:billing': { clients: ['acme-prod'], scopes: [] },
      });
      const found = problems({ BROKER_CONFIG_FILE: bad }).join('\n');
      expect(found).toContain('system:serviceaccount:shop:checkout');
      expect(found).toContain('must be "token", "forward" or "admin"');
      expect(found).toContain('grant at least one scope');
    });

    it('refuses a non-URL JWKS', () => {
      expect(
        problems({ ...CLIENT, ...K8S, CALLER_AUTH_JWKS_URL: 'kubernetes.default.svc' }),
      ).toEqual(['CALLER_AUTH_JWKS_URL: must be an absolute http:// or https:// URL']);
    });
  });

  describe('cache encryption', () => {
    it('reads the key reference from either variable', () => {
      expect(loadConfig({ ...CLIENT, ...API_KEYS, CACHE_KEY_FILE: '/k' }).cacheEncryption).toEqual({
        key: { file: '/k' },
      });
      expect(
        loadConfig({ ...CLIENT, ...API_KEYS, CACHE_KEY_SECRET_ID: 'tb/cache-key' }).cacheEncryption,
      ).toEqual({ key: { secretId: 'tb/cache-key' } });
      expect(
        problems({ ...CLIENT, ...API_KEYS, CACHE_KEY_SECRET_ID: 'a', CACHE_KEY_FILE: '/b' }).join(),
      ).toContain('set exactly one of secretId or file');
    });

    it('is required with Redis in production, optional otherwise', () => {
      const prod = { ...CLIENT, ...API_KEYS, NODE_ENV: 'production' };
      for (const nodeEnv of ['production', 'Production', 'prod']) {
        expect(problems({ ...prod, NODE_ENV: nodeEnv, REDIS_URL: 'rediss://cache:6379' })).toEqual([
          'CACHE_KEY_SECRET_ID or CACHE_KEY_FILE: required when Redis is used and NODE_ENV is not "development" or "test": the token must be encrypted at rest (generate a key with `openssl rand -base64 32`)',
        ]);
      }
      expect(
        loadConfig({ ...prod, REDIS_URL: 'rediss://cache:6379', CACHE_KEY_FILE: '/k' }).nodeEnv,
      ).toBe('production');
      // The memory store never lets the token out of the process.
      expect(loadConfig(prod).cacheEncryption).toEqual({});
      expect(
        loadConfig({
          ...CLIENT,
          ...API_KEYS,
          NODE_ENV: 'development',
          REDIS_URL: 'redis://cache:6379',
        }).cacheEncryption,
      ).toEqual({});
    });

    it('counts an unset NODE_ENV as production: the token is never stored in clear by omission', () => {
      const unset = { ...CLIENT, ...API_KEYS, REDIS_URL: 'redis://cache:6379' };
      expect(problems(unset)).toEqual([
        'CACHE_KEY_SECRET_ID or CACHE_KEY_FILE: required when Redis is used and NODE_ENV is not "development" or "test": the token must be encrypted at rest (generate a key with `openssl rand -base64 32`)',
      ]);
      expect(loadConfig({ ...CLIENT, ...API_KEYS }).nodeEnv).toBe('production');
    });

    it('is required in production for Sentinel and Cluster too, not only for REDIS_URL', () => {
      const prod = { ...CLIENT, ...API_KEYS, NODE_ENV: 'production' };
      const required = 'CACHE_KEY_SECRET_ID or CACHE_KEY_FILE: required when Redis is used';
      expect(
        problems({
          ...prod,
          REDIS_MODE: 'sentinel',
          REDIS_SENTINELS: 's0:26379',
          REDIS_SENTINEL_MASTER: 'mymaster',
        }).join(),
      ).toContain(required);
      expect(
        problems({ ...prod, REDIS_MODE: 'cluster', REDIS_CLUSTER_NODES: 'c0:6379' }).join(),
      ).toContain(required);
    });
  });

  describe('plain http:// toward the provider', () => {
    const PROD = { ...API_KEYS, CREDENTIALS_FILE: '/var/run/secrets/provider.json' };
    const reason = (carries: string) =>
      `must be https:// in production (NODE_ENV not "development" or "test"): ${carries} travels on it; plain http:// is accepted for a loopback host only (127.0.0.1, ::1, localhost)`;

    it('refuses it in production for the token and API URLs, naming each setting', () => {
      expect(
        problems({
          ...PROD,
          PROVIDER_AUTH_URL: 'http://partner.credify.tech',
          PROVIDER_BASE_URL: 'http://partner.credify.tech',
        }),
      ).toEqual([
        `PROVIDER_AUTH_URL: ${reason('the client secret')}`,
        `PROVIDER_BASE_URL: ${reason('the bearer token')}`,
      ]);
      for (const auth of ['client_secret_basic', 'client_secret_post']) {
        expect(
          problems({
            ...PROD,
            ...CLIENT,
            TOKEN_REQUEST_GRANT: 'rfc6749',
            TOKEN_REQUEST_AUTH: auth,
            TOKEN_REQUEST_URL: 'http://auth.ship.example/oauth2/token',
          }),
        ).toEqual([`TOKEN_REQUEST_URL: ${reason('the client secret')}`]);
      }
      expect(
        problems({
          ...PROD,
          ...CLIENT,
          TOKEN_REQUEST_GRANT: 'rfc6749',
          TOKEN_REQUEST_AUTH: 'private_key_jwt',
          TOKEN_REQUEST_URL: 'http://auth.ship.example/oauth2/token',
        }),
      ).toEqual([`TOKEN_REQUEST_URL: ${reason('the token it answers')}`]);
    });

    it.each(['http://127.0.0.1:9090', 'http://localhost:9090', 'http://[::1]:9090'])(
      'accepts it in production on a loopback host (%s: a sidecar, a local emulator)',
      (url) => {
        const cfg = loadConfig({ ...PROD, PROVIDER_AUTH_URL: url, PROVIDER_BASE_URL: url });
        expect(cfg.clients[0].authUrl).toBe(url);
      },
    );

    it('accepts it in development and test, where the emulators run', () => {
      for (const nodeEnv of ['development', 'test']) {
        const url = 'http://provider.internal';
        const cfg = loadConfig({
          ...PROD,
          NODE_ENV: nodeEnv,
          PROVIDER_AUTH_URL: url,
          PROVIDER_BASE_URL: url,
        });
        expect(cfg.clients[0].baseUrl).toBe(url);
      }
    });
  });

  describe('redis credentials', () => {
    it('takes password references, never a password: an inline value is refused unprinted', () => {
      const file = join(mkdtempSync(join(tmpdir(), 'tb-sec-')), 'b.yaml');
      writeFileSync(
        file,
        'redis: { url: "redis://c:6379", password: "hunter2-DO-NOT-PRINT" }\n' +
          'clients: [{id: a, authUrl: "https://a", baseUrl: "https://a", credentials: {file: /a}}]\n',
      );
      const found = problems({ ...API_KEYS, BROKER_CONFIG_FILE: file });
      expect(found.join('\n')).toContain('redis.password');
      expect(found.join('\n')).not.toContain('hunter2');
    });
  });
});
