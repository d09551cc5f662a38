import { randomBytes } from 'node:crypto';
import { loadCacheKeys } from './cache-encryption-keys';
import type { SecretReader, SecretRef } from './secret-reader';
import { SecretsErrorCode, SecretsException } from './secrets.exception';

function reader(value: string): SecretReader {
  return { read: async (_ref: SecretRef) => value };
}

const SOURCE = { secretId: 'token-broker/cache-key' };

describe(loadCacheKeys.name, () => {
  const k1 = randomBytes(32);
  const k2 = randomBytes(32);

  it('reads one base64 key (standard or URL-safe, padding optional, whitespace trimmed)', async () => {
    for (const text of [
      k1.toString('base64'),
      `${k1.toString('base64')}\n`,
      k1.toString('base64url'),
      k1.toString('base64').replace(/=+$/, ''),
    ]) {
      const keys = await loadCacheKeys(reader(text), SOURCE);
      expect(keys.current.equals(k1)).toBe(true);
      expect(keys.previous).toEqual([]);
    }
  });

  it('reads a keyring for rotation', async () => {
    const text = JSON.stringify({
      current: k2.toString('base64'),
      previous: [k1.toString('base64')],
    });
    const keys = await loadCacheKeys(reader(text), { file: '/mnt/secrets/cache-key' });
    expect(keys.current.equals(k2)).toBe(true);
    expect(keys.previous.map((k) => k.equals(k1))).toEqual([true]);
  });

  it.each([
    ['a hex key (64 characters decode to 48 bytes)', k1.toString('hex'), /decodes to 48 bytes/],
    ['a 16-byte key', randomBytes(16).toString('base64'), /decodes to 16 bytes/],
    ['not base64', 'this is not a key!', /not base64/],
    ['empty', '   ', /not base64/],
    ['a keyring without current', JSON.stringify({ previous: [] }), /"current"/],
    [
      'a keyring with a bad previous key',
      JSON.stringify({ current: k1.toString('base64'), previous: ['x'] }),
      /"previous"\[0\]/,
    ],
    ['broken JSON', '{"current": ', /not JSON/],
  ])('refuses %s, naming the setting and never the value', async (_label, text, reason) => {
    const err: unknown = await loadCacheKeys(reader(text), SOURCE).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SecretsException);
    const e = err as SecretsException;
    expect(e.code).toBe(SecretsErrorCode.Malformed);
    expect(e.message).toMatch(reason);
    expect(e.message).toContain('CACHE_KEY_SECRET_ID / CACHE_KEY_FILE');
    expect(e.message).toContain(SOURCE.secretId);
    if (text.trim().length > 4) expect(e.message).not.toContain(text.trim());
    expect(e.cause).toBeUndefined();
  });
});
