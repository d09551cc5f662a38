import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigException } from './config.exception';
import { loadConfig } from './config.loader';

const BASE = {
  PROVIDER_AUTH_URL: 'https://auth.example.com',
  PROVIDER_BASE_URL: 'https://api.example.com',
  CREDENTIALS_FILE: '/mnt/secrets/client.json',
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

describe('tokenRequest, a client profile for its token request', () => {
  it("defaults to the provider's dialect, so existing configurations are unchanged", () => {
    expect(loadConfig(BASE).clients[0].tokenRequest).toEqual({
      grant: 'provider-query',
      auth: 'client_secret_basic',
    });
  });

  it('reads a standard profile from the single-client environment', () => {
    const cfg = loadConfig({
      ...BASE,
      TOKEN_REQUEST_GRANT: 'rfc6749',
      TOKEN_REQUEST_URL: 'https://auth.example.com/oauth2/token/',
      TOKEN_REQUEST_AUTH: 'private_key_jwt',
      TOKEN_REQUEST_SCOPE: 'orders:write offers:read',
      TOKEN_REQUEST_AUDIENCE: 'https://api.example.com',
      TOKEN_REQUEST_RESOURCE: 'https://api.example.com/orders, https://api.example.com/offers',
      TOKEN_REQUEST_PARAMS: '{"tenant":"acme"}',
      TOKEN_REQUEST_HEADERS: '{"X-Tenant":"acme"}',
      TOKEN_REQUEST_ASSERTION_ALG: 'ES256',
      TOKEN_REQUEST_ASSERTION_KID: 'key-2026',
    });
    expect(cfg.clients[0].tokenRequest).toEqual({
      grant: 'rfc6749',
      // Verbatim: the token endpoint is also a private_key_jwt assertion's audience.
      url: 'https://auth.example.com/oauth2/token/',
      auth: 'private_key_jwt',
      scope: 'orders:write offers:read',
      audience: 'https://api.example.com',
      resource: ['https://api.example.com/orders', 'https://api.example.com/offers'],
      params: { tenant: 'acme' },
      headers: { 'X-Tenant': 'acme' },
      assertion: { alg: 'ES256', audience: 'token_endpoint', kid: 'key-2026', lifetimeSeconds: 60 },
    });
  });

  it('reads a profile per client from the config file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tb-token-request-'));
    const file = join(dir, 'broker.yaml');
    writeFileSync(
      file,
      [
        'callerAuth: { mode: api-key, apiKeysSource: { file: /k } }',
        'clients:',
        '  - id: acme-prod',
        '    authUrl: https://partner.upgrade.com',
        '    baseUrl: https://partner.upgrade.com',
        '    credentials: { file: /a }',
        '  - id: shipping',
        '    authUrl: https://auth.ship.example',
        '    baseUrl: https://api.ship.example',
        '    credentials: { secretId: shipping }',
        '    tokenRequest:',
        '      grant: rfc6749',
        '      url: https://auth.ship.example/token',
        '      auth: client_secret_post',
        '      resource: [https://api.ship.example]',
      ].join('\n'),
    );
    const cfg = loadConfig({ BROKER_CONFIG_FILE: file });
    expect(cfg.clients[0].tokenRequest.grant).toBe('provider-query');
    expect(cfg.clients[1].tokenRequest).toMatchObject({
      grant: 'rfc6749',
      auth: 'client_secret_post',
      resource: ['https://api.ship.example'],
    });
  });

  it.each([
    [
      'a standard setting with the provider dialect',
      { TOKEN_REQUEST_SCOPE: 'orders' },
      'TOKEN_REQUEST_SCOPE: only with grant "rfc6749"',
    ],
    [
      'another client authentication with the provider dialect',
      { TOKEN_REQUEST_AUTH: 'client_secret_post' },
      'TOKEN_REQUEST_AUTH: grant "provider-query" authenticates with client_secret_basic only',
    ],
    [
      'a standard grant without its token endpoint',
      { TOKEN_REQUEST_GRANT: 'rfc6749' },
      'TOKEN_REQUEST_URL: required with grant "rfc6749"',
    ],
    [
      'an assertion setting without private_key_jwt',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_ASSERTION_ALG: 'ES256',
      },
      'TOKEN_REQUEST_ASSERTION_KID: only with auth "private_key_jwt"',
    ],
    [
      'mutual TLS to a plain http:// endpoint',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'http://a/token',
        TOKEN_REQUEST_AUTH: 'tls_client_auth',
      },
      'TOKEN_REQUEST_URL: must be https://',
    ],
    [
      'an unknown algorithm',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_AUTH: 'private_key_jwt',
        TOKEN_REQUEST_ASSERTION_ALG: 'HS256',
      },
      'TOKEN_REQUEST_ASSERTION_ALG:',
    ],
    [
      'an extra parameter the broker sets itself',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_PARAMS: '{"client_secret":"sk_live_DO_NOT_PRINT_ME"}',
      },
      'TOKEN_REQUEST_PARAMS: is set by the broker',
    ],
    [
      'an extra header the broker sets itself',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_HEADERS: '{"Authorization":"Bearer sk_live_DO_NOT_PRINT_ME"}',
      },
      'TOKEN_REQUEST_HEADERS: is set by the broker',
    ],
    [
      'headers that are not JSON',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_HEADERS: 'X-Api-Key: sk_live_DO_NOT_PRINT_ME',
      },
      'TOKEN_REQUEST_HEADERS: must be a JSON object',
    ],
    [
      'a header value that would split the request',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_HEADERS: '{"X-Tenant":"a\\r\\nX-Key: sk_live_DO_NOT_PRINT_ME"}',
      },
      'TOKEN_REQUEST_HEADERS: must be printable ASCII',
    ],
    [
      'a resource with a fragment',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_RESOURCE: 'https://api.example.com/#orders',
      },
      'TOKEN_REQUEST_RESOURCE: must be an absolute URI without a fragment',
    ],
  ])('refuses %s, naming the setting and never a value', (_label, env, expected) => {
    const found = problems({ ...BASE, ...env });
    expect(found.join('\n')).toContain(expected);
    expect(found.join('\n')).not.toContain('sk_live_DO_NOT_PRINT_ME');
  });

  it('configures a mutual-TLS client from the environment alone: issuer, key files, CA file', () => {
    const client = loadConfig({
      ...BASE,
      PROVIDER_AUTH_URL: undefined,
      CREDENTIALS_FILE: undefined,
      TOKEN_REQUEST_GRANT: 'rfc6749',
      TOKEN_REQUEST_ISSUER: 'https://auth.example.com',
      TOKEN_REQUEST_AUTH: 'tls_client_auth',
      CREDENTIALS_CLIENT_ID: 'shop-mtls',
      CREDENTIALS_CERTIFICATE_FILE: '/mnt/tls/tls.crt',
      CREDENTIALS_PRIVATE_KEY_FILE: '/mnt/tls/tls.key',
      PROVIDER_CA_FILE: '/mnt/ca/ca.crt',
    }).clients[0];
    // authUrl is the provider dialect's: an rfc6749 client needs none.
    expect(client.authUrl).toBeUndefined();
    expect(client.caFile).toBe('/mnt/ca/ca.crt');
    expect(client.credentials).toEqual({
      clientId: 'shop-mtls',
      certificateFile: '/mnt/tls/tls.crt',
      privateKeyFile: '/mnt/tls/tls.key',
    });
    expect(client.tokenRequest).toEqual({
      grant: 'rfc6749',
      issuer: 'https://auth.example.com',
      auth: 'tls_client_auth',
    });
  });

  it.each([
    [
      'no authUrl with the provider dialect',
      { PROVIDER_AUTH_URL: undefined },
      'PROVIDER_AUTH_URL: required with grant "provider-query"',
    ],
    [
      'neither a url nor an issuer',
      { TOKEN_REQUEST_GRANT: 'rfc6749' },
      'TOKEN_REQUEST_URL: required with grant "rfc6749": the token endpoint URL, or tokenRequest.issuer',
    ],
    [
      'an issuer-addressed assertion without an issuer',
      {
        TOKEN_REQUEST_GRANT: 'rfc6749',
        TOKEN_REQUEST_URL: 'https://a/token',
        TOKEN_REQUEST_AUTH: 'private_key_jwt',
        TOKEN_REQUEST_ASSERTION_AUDIENCE: 'issuer',
      },
      'TOKEN_REQUEST_ASSERTION_AUDIENCE: "issuer" needs tokenRequest.issuer',
    ],
    [
      'an issuer with the provider dialect',
      { TOKEN_REQUEST_ISSUER: 'https://auth.example.com' },
      'TOKEN_REQUEST_ISSUER: only with grant "rfc6749"',
    ],
  ])('refuses %s, naming the setting', (_label, env, expected) => {
    expect(problems({ ...BASE, ...env }).join('\n')).toContain(expected);
  });

  it('names file settings by their path', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tb-token-request-'));
    const file = join(dir, 'broker.json');
    writeFileSync(
      file,
      JSON.stringify({
        callerAuth: { mode: 'api-key', apiKeysSource: { file: '/k' } },
        clients: [
          {
            id: 'a',
            authUrl: 'https://a',
            baseUrl: 'https://a',
            credentials: { file: '/a' },
            tokenRequest: { auth: 'private_key_jwt' },
          },
        ],
      }),
    );
    expect(problems({ BROKER_CONFIG_FILE: file })).toEqual([
      `${file}: clients[0].tokenRequest.auth: grant "provider-query" authenticates with client_secret_basic only; set grant to "rfc6749" for other methods`,
    ]);
  });

  describe('credentials from key files, as a Kubernetes TLS Secret holds them', () => {
    const MTLS = { grant: 'rfc6749', url: 'https://a/token', auth: 'tls_client_auth' };
    const configWith = (credentials: object, tokenRequest: object = MTLS) => {
      const file = join(mkdtempSync(join(tmpdir(), 'tb-token-request-')), 'broker.json');
      writeFileSync(
        file,
        JSON.stringify({
          callerAuth: { mode: 'api-key', apiKeysSource: { file: '/k' } },
          clients: [
            { id: 'a', authUrl: 'https://a', baseUrl: 'https://a', credentials, tokenRequest },
          ],
        }),
      );
      return { BROKER_CONFIG_FILE: file };
    };
    const FILES = { clientId: 'shop', certificateFile: '/m/tls.crt', privateKeyFile: '/m/tls.key' };

    it('reads the files for tls_client_auth, and the key alone for private_key_jwt', () => {
      expect(loadConfig(configWith(FILES)).clients[0].credentials).toEqual(FILES);
      const jwt = { clientId: 'shop', privateKeyFile: '/m/tls.key' };
      expect(
        loadConfig(configWith(jwt, { ...MTLS, auth: 'private_key_jwt' })).clients[0].credentials,
      ).toEqual(jwt);
    });

    it.each([
      [
        'key files beside a secret',
        { ...FILES, secretId: 'sk_live_DO_NOT_PRINT_ME' },
        MTLS,
        'clients[0].credentials.privateKeyFile: key files replace the JSON',
      ],
      [
        'key files without the client id',
        { privateKeyFile: '/m/tls.key', certificateFile: '/m/tls.crt' },
        MTLS,
        'clients[0].credentials.clientId: required with privateKeyFile',
      ],
      [
        'a certificate without its key',
        { clientId: 'shop', file: '/a', certificateFile: '/m/tls.crt' },
        MTLS,
        'clients[0].credentials.certificateFile: only with privateKeyFile',
      ],
      [
        'mutual TLS without the certificate',
        { clientId: 'shop', privateKeyFile: '/m/tls.key' },
        MTLS,
        'clients[0].credentials.certificateFile: required with auth "tls_client_auth"',
      ],
      [
        'a certificate with private_key_jwt',
        FILES,
        { ...MTLS, auth: 'private_key_jwt' },
        'clients[0].credentials.certificateFile: only with the mutual-TLS methods',
      ],
      [
        'key files with a shared-secret method',
        FILES,
        { ...MTLS, auth: 'client_secret_post' },
        'clients[0].credentials.privateKeyFile: only with auth "private_key_jwt", "tls_client_auth" or "self_signed_tls_client_auth"',
      ],
    ])(
      'refuses %s, naming the setting and never a value',
      (_label, credentials, request, expected) => {
        const found = problems(configWith(credentials, request)).join('\n');
        expect(found).toContain(expected);
        expect(found).not.toContain('sk_live_DO_NOT_PRINT_ME');
      },
    );
  });
});
