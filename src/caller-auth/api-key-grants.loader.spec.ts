import { createHash } from 'node:crypto';
import type { SecretReader } from '../secrets/secret-reader';
import { SecretsErrorCode, SecretsException } from '../secrets/secrets.exception';
import { loadApiKeyGrants } from './api-key-grants.loader';

const reader = (text: string): SecretReader => ({ read: async () => text });
const hash = createHash('sha256').update('the-key').digest('hex');
const KNOWN = new Set(['acme-prod', 'acme-preprod']);
const SOURCE = { secretId: 'token-broker/caller-api-keys' };

describe(loadApiKeyGrants.name, () => {
  it('reads the JSON list of grants, normalising hashes to lowercase', async () => {
    const text = JSON.stringify([
      { name: 'checkout', sha256: hash.toUpperCase(), clients: ['acme-prod'] },
      { name: 'ops', sha256: 'a'.repeat(64), clients: ['*'], scopes: ['admin'] },
    ]);
    expect(await loadApiKeyGrants(reader(text), SOURCE, KNOWN)).toEqual([
      { name: 'checkout', sha256: hash, clients: ['acme-prod'], scopes: ['token', 'forward'] },
      { name: 'ops', sha256: 'a'.repeat(64), clients: ['*'], scopes: ['admin'] },
    ]);
  });

  it.each([
    ['not JSON', 'checkout=the-key', /not JSON/],
    [
      'a raw key instead of its hash',
      JSON.stringify([{ name: 'c', sha256: 'the-key', clients: ['acme-prod'] }]),
      /malformed at \[0\.sha256\]/,
    ],
    [
      'no clients',
      JSON.stringify([{ name: 'c', sha256: hash, clients: [] }]),
      /malformed at \[0\.clients\]/,
    ],
    [
      'an unknown field',
      JSON.stringify([{ name: 'c', sha256: hash, clients: ['acme-prod'], key: 'the-key' }]),
      /malformed at \[0\]/,
    ],
    [
      'a duplicate key',
      JSON.stringify([
        { name: 'a', sha256: hash, clients: ['*'] },
        { name: 'b', sha256: hash, clients: ['*'] },
      ]),
      /malformed at \[1\.sha256\]/,
    ],
    [
      'an unconfigured client',
      JSON.stringify([{ name: 'c', sha256: hash, clients: ['globex-prod'] }]),
      /not configured/,
    ],
  ])('refuses %s, naming the secret and never quoting it', async (_label, text, reason) => {
    const err: unknown = await loadApiKeyGrants(reader(text), SOURCE, KNOWN).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(SecretsException);
    expect((err as SecretsException).code).toBe(SecretsErrorCode.Malformed);
    expect((err as SecretsException).message).toMatch(reason);
    expect((err as SecretsException).message).toContain(SOURCE.secretId);
    expect((err as SecretsException).message).not.toContain('the-key');
  });
});
