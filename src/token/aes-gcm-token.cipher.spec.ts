import { createCipheriv, randomBytes } from 'node:crypto';
import { AesGcmTokenCipher, cacheKeyId } from './aes-gcm-token.cipher';
import { PlainTokenCipher } from './token-cipher';

const TOKEN = 'eyJhbGciOiJSUzI1NiJ9.provider-access-token.signature';

/** `TOKEN` sealed as a given format version would have sealed it, with `aad`. */
function sealedAs(version: string, key: Buffer, aad: Buffer): string {
  const iv = randomBytes(12);
  const c = createCipheriv('aes-256-gcm', key, iv, { authTagLength: 16 });
  c.setAAD(aad);
  const body = Buffer.concat([iv, c.update(TOKEN, 'utf8'), c.final(), c.getAuthTag()]);
  return `${version}:${cacheKeyId(key)}:${body.toString('base64url')}`;
}

describe(AesGcmTokenCipher.name, () => {
  const k1 = randomBytes(32);
  const k2 = randomBytes(32);

  it('round-trips a token, and the sealed value reveals neither the token nor the key', () => {
    const cipher = new AesGcmTokenCipher(k1);
    const sealed = cipher.seal('acme-prod', TOKEN);
    expect(sealed).toMatch(new RegExp(`^gcm3:${cacheKeyId(k1)}:[A-Za-z0-9_-]+$`));
    expect(sealed).not.toContain(TOKEN);
    expect(sealed).not.toContain('provider-access-token');
    expect(sealed).not.toContain(k1.toString('base64'));
    expect(cipher.open('acme-prod', sealed)).toBe(TOKEN);
  });

  it('uses a fresh IV each time: sealing twice gives two different values', () => {
    const cipher = new AesGcmTokenCipher(k1);
    const a = cipher.seal('acme-prod', TOKEN);
    const b = cipher.seal('acme-prod', TOKEN);
    expect(a).not.toBe(b);
    expect(cipher.open('acme-prod', a)).toBe(cipher.open('acme-prod', b));
  });

  it('binds the client id: a value moved to another client does not open', () => {
    const cipher = new AesGcmTokenCipher(k1);
    const sealed = cipher.seal('acme-prod', TOKEN);
    expect(() => cipher.open('acme-preprod', sealed)).toThrow(/failed authentication/);
  });

  it('refuses tampering anywhere in the value', () => {
    const cipher = new AesGcmTokenCipher(k1);
    const sealed = cipher.seal('acme-prod', TOKEN);
    const body = Buffer.from(sealed.split(':')[2], 'base64url');
    for (const at of [0, 12, body.length - 17, body.length - 1]) {
      const bad = Buffer.from(body);
      bad[at] ^= 0x01;
      const forged = `gcm3:${cacheKeyId(k1)}:${bad.toString('base64url')}`;
      expect(() => cipher.open('acme-prod', forged)).toThrow();
    }
    // A truncated tag must not be accepted as a shorter one.
    const truncated = `gcm3:${cacheKeyId(k1)}:${body.subarray(0, body.length - 4).toString('base64url')}`;
    expect(() => cipher.open('acme-prod', truncated)).toThrow();
  });

  it.each([
    ['empty', ''],
    ['plain', 'plain:token'],
    ['no key id', 'gcm1:'],
    ['unknown key id', 'gcm1:00000000:AAAA'],
    ['too short', `gcm1:KID:AAAA`],
    ['garbage', 'gcm1:KID:!!!!'],
    ['no key id (gcm2)', 'gcm2:'],
    ['too short (gcm2)', `gcm2:KID:AAAA`],
    ['garbage (gcm2)', 'gcm2:KID:!!!!'],
    ['no key id (gcm3)', 'gcm3:'],
    ['too short (gcm3)', `gcm3:KID:AAAA`],
    ['garbage (gcm3)', 'gcm3:KID:!!!!'],
  ])('throws (never crashes) on a %s value', (_label, value) => {
    const cipher = new AesGcmTokenCipher(k1);
    expect(() => cipher.open('acme-prod', value.replace('KID', cipher.currentKeyId))).toThrow(
      Error,
    );
  });

  it('rotates: writes with the current key, reads values written with a previous one', () => {
    const before = new AesGcmTokenCipher(k1);
    const old = before.seal('acme-prod', TOKEN);
    const after = new AesGcmTokenCipher(k2, [k1]);
    expect(after.currentKeyId).toBe(cacheKeyId(k2));
    expect(after.keyIds.sort()).toEqual([cacheKeyId(k1), cacheKeyId(k2)].sort());
    expect(after.open('acme-prod', old)).toBe(TOKEN);
    const fresh = after.seal('acme-prod', TOKEN);
    expect(fresh.startsWith(`gcm3:${cacheKeyId(k2)}:`)).toBe(true);
    // A replica that has not got the new key yet treats the new value as unreadable.
    expect(() => before.open('acme-prod', fresh)).toThrow();
  });

  it('cannot open a value sealed under another key with the same id (a forged id)', () => {
    const sealed = new AesGcmTokenCipher(k2).seal('acme-prod', TOKEN);
    const relabelled = sealed.replace(cacheKeyId(k2), cacheKeyId(k1));
    expect(() => new AesGcmTokenCipher(k1).open('acme-prod', relabelled)).toThrow();
  });

  it('refuses keys that are not 32 bytes', () => {
    expect(() => new AesGcmTokenCipher(randomBytes(16))).toThrow(RangeError);
    expect(() => new AesGcmTokenCipher(k1, [randomBytes(31)])).toThrow(RangeError);
  });

  it('does not open plain values, and the plain cipher does not open sealed ones', () => {
    const plain = new PlainTokenCipher();
    const aes = new AesGcmTokenCipher(k1);
    expect(() => aes.open('acme-prod', plain.seal('acme-prod', TOKEN))).toThrow();
    expect(() => plain.open('acme-prod', aes.seal('acme-prod', TOKEN))).toThrow();
  });

  it('binds the context: a value opened with another fingerprint, lifetime or expiry fails', () => {
    const cipher = new AesGcmTokenCipher(k1);
    const context = 'fp=0123456789abcdef;life=60000;wexp=1800000000000';
    const sealed = cipher.seal('acme-prod', TOKEN, context);
    expect(cipher.open('acme-prod', sealed, context)).toBe(TOKEN);
    for (const edited of [
      context.replace('wexp=1800000000000', 'wexp=1900000000000'),
      context.replace('life=60000', 'life=86400000'),
      context.replace('fp=0123', 'fp=f123'),
      '',
    ]) {
      expect(() => cipher.open('acme-prod', sealed, edited)).toThrow(/failed authentication/);
    }
  });

  it('binds the revocation generation: a value opened in another generation fails', () => {
    const cipher = new AesGcmTokenCipher(k1);
    const context = 'fp=0123456789abcdef;life=60000;wexp=1800000000000';
    const sealed = cipher.seal('acme-prod', TOKEN, context, 3);
    expect(cipher.open('acme-prod', sealed, context, 3)).toBe(TOKEN);
    for (const other of [0, 2, 4, 30]) {
      expect(() => cipher.open('acme-prod', sealed, context, other)).toThrow(
        /failed authentication/,
      );
    }
    // Relabelled as the previous version, whose data has no generation, it opens under none.
    const relabelled = sealed.replace(/^gcm3:/, 'gcm2:');
    for (const edited of [context, `${context}\u00003`, `${context}\u0000gen=3`]) {
      expect(() => cipher.open('acme-prod', relabelled, edited, 3)).toThrow();
    }
  });

  it('opens the previous version (gcm2: no generation) in any generation, for rolling upgrades', () => {
    const context = 'fp=0123456789abcdef;life=60000;wexp=1800000000000';
    const previous = sealedAs('gcm2', k1, Buffer.from(`acme-prod\u0000${context}`));
    const cipher = new AesGcmTokenCipher(k1);
    expect(cipher.open('acme-prod', previous, context, 0)).toBe(TOKEN);
    expect(cipher.open('acme-prod', previous, context, 7)).toBe(TOKEN);
    expect(() => cipher.open('acme-prod', previous, context.replace('life=6', 'life=9'))).toThrow();
    expect(() => cipher.open('acme-preprod', previous, context)).toThrow();
  });

  it('no longer opens the earliest format (gcm1: the client id only, its context not bound)', () => {
    const legacy = sealedAs('gcm1', k1, Buffer.from('acme-prod'));
    const cipher = new AesGcmTokenCipher(k1);
    expect(() => cipher.open('acme-prod', legacy, 'fp=x;life=1;wexp=2')).toThrow();
    expect(() => cipher.open('acme-prod', legacy)).toThrow();
  });

  it('authenticates records with a MAC under any configured key, and refuses any change', () => {
    const parts = ['acme-prod', 'key-hash', Buffer.from('{"id":1}')];
    const before = new AesGcmTokenCipher(k1);
    const tag = before.mac(parts);
    expect(tag).toMatch(new RegExp(`^${cacheKeyId(k1)}:[A-Za-z0-9_-]{43}$`));
    expect(before.verifyMac(parts, tag)).toBe(true);
    expect(new AesGcmTokenCipher(k2, [k1]).verifyMac(parts, tag)).toBe(true);
    expect(new AesGcmTokenCipher(k2).verifyMac(parts, tag)).toBe(false);
    expect(before.verifyMac(['acme-prod', 'key-hash', Buffer.from('{"id":2}')], tag)).toBe(false);
    // Length-prefixed: moving a byte between parts changes the MAC.
    expect(before.verifyMac(['acme-pro', 'dkey-hash', Buffer.from('{"id":1}')], tag)).toBe(false);
    for (const bad of ['', 'none', `${cacheKeyId(k1)}:`, `${cacheKeyId(k1)}:${'A'.repeat(43)}`]) {
      expect(before.verifyMac(parts, bad)).toBe(false);
    }
  });

  it('seals bytes for one context: round-trips under any configured key, refuses another context or any change', () => {
    const k1 = randomBytes(32);
    const cipher = new AesGcmTokenCipher(k1);
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    const context = ['idempotency answer', 'acme', 'checkout', 'a'.repeat(64)];
    const sealed = cipher.sealBytes(context, bytes);
    expect(sealed.includes(bytes)).toBe(false);
    expect(cipher.openBytes(context, sealed)).toEqual(bytes);
    expect(new AesGcmTokenCipher(randomBytes(32), [k1]).openBytes(context, sealed)).toEqual(bytes);
    expect(() =>
      cipher.openBytes([...context.slice(0, 2), 'marketing', context[3]], sealed),
    ).toThrow();
    for (let i = 0; i < sealed.length; i++) {
      const bad = Buffer.from(sealed);
      bad[i] ^= 1;
      expect(() => cipher.openBytes(context, bad)).toThrow();
    }
    expect(() => new AesGcmTokenCipher(randomBytes(32)).openBytes(context, sealed)).toThrow();
  });
});
