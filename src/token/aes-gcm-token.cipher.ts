import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';
import type { TokenCipher } from './token-cipher';

const ALGORITHM = 'aes-256-gcm';
const IV_BYTES = 12;
const TAG_BYTES = 16;
export const KEY_BYTES = 32;
/** Sealed values look like `gcm1:<key id>:<base64url(iv ‖ ciphertext ‖ tag)>`. */
const PREFIX = 'gcm1:';

/**
 * A key's id: 8 hex digits of an HMAC of a fixed label under the key. It is derived, not
 * configured, so it can never point at the wrong key, and it reveals nothing about the key.
 */
export function cacheKeyId(key: Buffer): string {
  return createHmac('sha256', key).update('token-broker cache key id').digest('hex').slice(0, 8);
}

/**
 * Seals the token for the shared store with AES-256-GCM: a random 96-bit IV per value, the
 * client id as associated data (a value copied to another client's key fails to open), and
 * the key id in clear so rotation works: values are written with the current key and read
 * with whichever configured key wrote them.
 */
export class AesGcmTokenCipher implements TokenCipher {
  private readonly current: { id: string; key: Buffer };
  private readonly byId = new Map<string, Buffer[]>();

  /** `current` writes and reads; `previous` keys only read (values written before a rotation). */
  constructor(current: Buffer, previous: readonly Buffer[] = []) {
    for (const key of [current, ...previous]) {
      if (key.length !== KEY_BYTES) throw new RangeError(`AES-256 keys are ${KEY_BYTES} bytes`);
      const id = cacheKeyId(key);
      // Two distinct keys could share an 8-digit id; opening then simply tries both.
      this.byId.set(id, [...(this.byId.get(id) ?? []), key]);
    }
    this.current = { id: cacheKeyId(current), key: current };
  }

  /** The id written into new values (safe to log). */
  get currentKeyId(): string {
    return this.current.id;
  }

  /** Every id this cipher can open (safe to log). */
  get keyIds(): string[] {
    return [...this.byId.keys()];
  }

  seal(clientId: string, accessToken: string): string {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv(ALGORITHM, this.current.key, iv, { authTagLength: TAG_BYTES });
    cipher.setAAD(Buffer.from(clientId, 'utf8'));
    const body = Buffer.concat([
      iv,
      cipher.update(accessToken, 'utf8'),
      cipher.final(),
      cipher.getAuthTag(),
    ]);
    return `${PREFIX}${this.current.id}:${body.toString('base64url')}`;
  }

  open(clientId: string, sealed: string): string {
    if (!sealed.startsWith(PREFIX)) throw new Error('not an AES-GCM sealed value');
    const idEnd = sealed.indexOf(':', PREFIX.length);
    const keys = idEnd > 0 ? this.byId.get(sealed.slice(PREFIX.length, idEnd)) : undefined;
    if (keys === undefined) throw new Error('sealed with a key this broker does not have');
    const body = Buffer.from(sealed.slice(idEnd + 1), 'base64url');
    if (body.length < IV_BYTES + TAG_BYTES) throw new Error('sealed value too short');
    const iv = body.subarray(0, IV_BYTES);
    const tag = body.subarray(body.length - TAG_BYTES);
    const text = body.subarray(IV_BYTES, body.length - TAG_BYTES);
    for (const key of keys) {
      try {
        const decipher = createDecipheriv(ALGORITHM, key, iv, { authTagLength: TAG_BYTES });
        decipher.setAAD(Buffer.from(clientId, 'utf8'));
        decipher.setAuthTag(tag);
        return Buffer.concat([decipher.update(text), decipher.final()]).toString('utf8');
      } catch {
        // Wrong key, another client's value, or tampered: try the next key with this id.
      }
    }
    throw new Error('sealed value failed authentication (wrong key, tampered, or another client)');
  }
}
