import { loadClientCredentials, parseClientCredentials } from './client-credentials';
import type { SecretReader, SecretRef } from './secret-reader';
import { SecretsErrorCode, SecretsException } from './secrets.exception';

const KEY =
  '-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIDO_NOT_PRINT_ME\n-----END PRIVATE KEY-----';
const CERT = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----';

describe(parseClientCredentials.name, () => {
  it('reads what each client authentication method needs', () => {
    expect(
      parseClientCredentials('{"client_id":"a","client_secret":"s"}', 'f', 'client_secret_post'),
    ).toEqual({ clientId: 'a', clientSecret: 's' });
    expect(
      parseClientCredentials(
        JSON.stringify({ client_id: 'a', private_key: KEY }),
        'f',
        'private_key_jwt',
      ),
    ).toEqual({ clientId: 'a', privateKey: KEY });
    // A JWK may be stored as an object; it is kept as JSON text.
    expect(
      parseClientCredentials(
        JSON.stringify({
          client_id: 'a',
          private_key: { kty: 'OKP', crv: 'Ed25519', d: 'x', x: 'y' },
        }),
        'f',
        'private_key_jwt',
      ).privateKey,
    ).toBe('{"kty":"OKP","crv":"Ed25519","d":"x","x":"y"}');
    expect(
      parseClientCredentials(
        JSON.stringify({ client_id: 'a', certificate: CERT, private_key: KEY }),
        'f',
        'tls_client_auth',
      ),
    ).toEqual({ clientId: 'a', certificate: CERT, privateKey: KEY });
  });

  it.each([
    [
      'a key where a secret is needed',
      { client_id: 'a', private_key: KEY },
      'client_secret_basic',
      /lack client_secret, which auth "client_secret_basic" needs/,
    ],
    [
      'a secret where a key is needed',
      { client_id: 'a', client_secret: 'sk_DO_NOT_PRINT_ME' },
      'private_key_jwt',
      /lack private_key, which auth "private_key_jwt" needs/,
    ],
    [
      'a secret beside the key',
      { client_id: 'a', client_secret: 'sk_DO_NOT_PRINT_ME', private_key: KEY },
      'private_key_jwt',
      /hold a client_secret, but auth "private_key_jwt" uses a key/,
    ],
    [
      'a key without its certificate',
      { client_id: 'a', private_key: KEY },
      'tls_client_auth',
      /lack certificate/,
    ],
  ] as const)('refuses %s, naming fields and never values', (_label, json, auth, reason) => {
    let err: unknown;
    try {
      parseClientCredentials(JSON.stringify(json), '/mnt/secrets/c.json', auth);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(SecretsException);
    const e = err as SecretsException;
    expect(e.code).toBe(SecretsErrorCode.Malformed);
    expect(e.message).toMatch(reason);
    expect(e.message).toContain('/mnt/secrets/c.json');
    expect(e.message).not.toMatch(/DO_NOT_PRINT_ME/);
  });
});

describe(loadClientCredentials.name, () => {
  // A mounted Secret whose files change between reads, as a rotation does.
  const files = new Map([
    ['/m/tls.crt', CERT],
    ['/m/tls.key', KEY],
  ]);
  const reader: SecretReader = {
    read: (ref: SecretRef) => Promise.resolve(files.get(ref.file!)!),
  };
  const source = { clientId: 'shop', certificateFile: '/m/tls.crt', privateKeyFile: '/m/tls.key' };

  it('reads key files as they are, again on every call', async () => {
    await expect(loadClientCredentials(reader, source, 'tls_client_auth')).resolves.toEqual({
      clientId: 'shop',
      certificate: CERT,
      privateKey: KEY,
    });
    files.set('/m/tls.key', `${KEY}\n`);
    await expect(
      loadClientCredentials(
        reader,
        { clientId: 'shop', privateKeyFile: '/m/tls.key' },
        'private_key_jwt',
      ),
    ).resolves.toEqual({ clientId: 'shop', privateKey: `${KEY}\n` });
  });
});
