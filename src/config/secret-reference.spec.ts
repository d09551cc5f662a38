import {
  describeCredentialsSource,
  looksLikeSettingName,
  REFERENCE_NOT_SHOWN,
  shownReference,
} from './secret-reference';

describe(shownReference.name, () => {
  it.each([
    'token-broker/acme-prod',
    'arn:aws:secretsmanager:eu-west-1:123456789012:secret:token-broker/acme-prod-AbCdEf',
    '/var/run/secrets/token-broker/credentials.json',
    '/mnt/secrets-store/acme prod.json',
  ])('prints a reference that looks like one: %s', (reference) => {
    expect(shownReference(reference)).toBe(reference);
  });

  it.each([
    ['a hex key', 'a3f9'.repeat(16)],
    ['a base64 key', 'q7Zp3YV0kR8mWc2LxN5tB9hJ4dF6gS1aE0uI+oT='],
    ['a GitHub token', 'ghp_4f9Qz7LkX2vB8nR1tY6wE3mA0sD5cH9jK2pL'],
    ['a JSON secret', '{"client_id":"acme","client_secret":"x"}'],
    ['a PEM', '-----BEGIN PRIVATE KEY-----\nMIIE\n'],
    ['a short mixed-case password-like run', 'Xk29Lm4Qp8Rt7Vw3Zy6B'],
  ])('hides %s pasted in its place', (_kind, value) => {
    expect(shownReference(value)).toBe(REFERENCE_NOT_SHOWN);
  });

  it('names the source of credentials, hiding what does not look like a reference', () => {
    expect(describeCredentialsSource({ secretId: 'token-broker/acme' })).toBe(
      'Secrets Manager secret "token-broker/acme"',
    );
    expect(describeCredentialsSource({ privateKeyFile: '/mnt/acme/tls.key' })).toBe(
      'key file "/mnt/acme/tls.key" (credentials.privateKeyFile)',
    );
    expect(
      describeCredentialsSource({
        certificateFile: '/mnt/acme/tls.crt',
        privateKeyFile: '/mnt/acme/tls.key',
      }),
    ).toBe(
      'key files "/mnt/acme/tls.crt" (credentials.certificateFile) and "/mnt/acme/tls.key" (credentials.privateKeyFile)',
    );
    expect(describeCredentialsSource({ file: 'ab12'.repeat(10) })).toBe(
      `file "${REFERENCE_NOT_SHOWN}"`,
    );
  });
});

describe(looksLikeSettingName.name, () => {
  it('takes short identifiers, not pasted secrets', () => {
    for (const key of ['tokn', 'refreshAheadSeconds', 'client_id', 'X-Tenant']) {
      expect([key, looksLikeSettingName(key)]).toEqual([key, true]);
    }
    for (const key of [
      'ghp_4f9Qz7LkX2vB8nR1tY6wE3mA0sD5cH9jK2pL',
      'client_secret: x',
      'a'.repeat(65),
    ]) {
      expect([key, looksLikeSettingName(key)]).toEqual([key, false]);
    }
  });
});
