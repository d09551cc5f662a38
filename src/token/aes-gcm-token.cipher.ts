import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  randomBytes,
  timingSafeEqual,
} from 'node:crypto';
import type { TokenCipher } from './token-cipher';

const ALGORITHM = 'aes-256-gcm';
const IV_BYTES = 12;
const TAG_BYTES = 16;
export const KEY_BYTES = 32;
/**
 * Sealed values look like `gcm3:<key id>:<base64url(iv ‖ ciphertext ‖ tag)>`, the associated
 * data binding the client id, the record's context and the client's revocation generation
 * (see {@link AesGcmTokenCipher.seal}). `gcm2:` values (the previous version: no generation)
 * are still read, because old and new replicas share one Redis during a rolling upgrade; the
 * previous version cannot read `gcm3:`, treats it as unreadable and fetches its own token, at
 * most once per token lifetime. `gcm1:` values (the client id only: their expiry could be
 * pinned by anyone who can write Redis) are refused.
 */
const PREFIX = 'gcm3:';
const UNBOUND_PREFIX = 'gcm2:';
/** Sealed bytes: `gcmb:<key id>:` then iv ‖ ciphertext ‖ tag, raw (see {@link AesGcmTokenCipher.sealBytes}). */
const BYTES_PREFIX = 'gcmb:';
/** Label of the MAC key derived from each cache key (never the encryption key itself). */
const MAC_LABEL = 'token-broker record mac';

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
  /** Per key id, the MAC keys derived from the cache keys with that id. */
  private readonly macKeysById = new Map<string, Buffer[]>();
  readonly authenticates = true;

  /** `current` writes and reads; `previous` keys only read (values written before a rotation). */
  constructor(current: Buffer, previous: readonly Buffer[] = []) {
    for (const key of [current, ...previous]) {
      if (key.length !== KEY_BYTES) throw new RangeError(`AES-256 keys are ${KEY_BYTES} bytes`);
      const id = cacheKeyId(key);
      // Two distinct keys could share an 8-digit id; opening then simply tries both.
      this.byId.set(id, [...(this.byId.get(id) ?? []), key]);
      this.macKeysById.set(id, [...(this.macKeysById.get(id) ?? []), macKey(key)]);
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

  /**
   * Seals `accessToken` for `clientId`. `context` (what the store keeps in clear next to the
   * value: fingerprint, lifetime, writer's expiry) and `generation` (the client's revocation
   * generation) are authenticated with it: a value whose clear fields were edited, moved to
   * another client, or put back after a revoke, fails to open.
   */
  seal(clientId: string, accessToken: string, context = '', generation = 0): string {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv(ALGORITHM, this.current.key, iv, { authTagLength: TAG_BYTES });
    cipher.setAAD(boundData(clientId, context, generation));
    const body = Buffer.concat([
      iv,
      cipher.update(accessToken, 'utf8'),
      cipher.final(),
      cipher.getAuthTag(),
    ]);
    return `${PREFIX}${this.current.id}:${body.toString('base64url')}`;
  }

  open(clientId: string, sealed: string, context = '', generation = 0): string {
    const unbound = sealed.startsWith(UNBOUND_PREFIX);
    if (!unbound && !sealed.startsWith(PREFIX)) throw new Error('not an AES-GCM sealed value');
    const aad = unbound
      ? associatedData(clientId, context)
      : boundData(clientId, context, generation);
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
        decipher.setAAD(aad);
        decipher.setAuthTag(tag);
        return Buffer.concat([decipher.update(text), decipher.final()]).toString('utf8');
      } catch {
        // Wrong key, another client's value, or tampered: try the next key with this id.
      }
    }
    throw new Error(
      'sealed value failed authentication (wrong key, tampered, another client or generation)',
    );
  }

  /**
   * Seals `bytes` (raw, for a binary store field) with the current key; the associated data is
   * `context` length-prefixed, so the value only opens for the record it was written for.
   */
  sealBytes(context: readonly string[], bytes: Buffer): Buffer {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv(ALGORITHM, this.current.key, iv, { authTagLength: TAG_BYTES });
    cipher.setAAD(lengthPrefixed(context));
    return Buffer.concat([
      Buffer.from(`${BYTES_PREFIX}${this.current.id}:`, 'latin1'),
      iv,
      cipher.update(bytes),
      cipher.final(),
      cipher.getAuthTag(),
    ]);
  }

  openBytes(context: readonly string[], sealed: Buffer): Buffer {
    const header = BYTES_PREFIX.length + 9;
    const keys =
      sealed.subarray(0, BYTES_PREFIX.length).toString('latin1') === BYTES_PREFIX &&
      sealed[header - 1] === 0x3a
        ? this.byId.get(sealed.subarray(BYTES_PREFIX.length, header - 1).toString('latin1'))
        : undefined;
    if (keys === undefined) throw new Error('not sealed bytes, or sealed with an unknown key');
    if (sealed.length < header + IV_BYTES + TAG_BYTES) throw new Error('sealed value too short');
    const iv = sealed.subarray(header, header + IV_BYTES);
    const tag = sealed.subarray(sealed.length - TAG_BYTES);
    const text = sealed.subarray(header + IV_BYTES, sealed.length - TAG_BYTES);
    for (const key of keys) {
      try {
        const decipher = createDecipheriv(ALGORITHM, key, iv, { authTagLength: TAG_BYTES });
        decipher.setAAD(lengthPrefixed(context));
        decipher.setAuthTag(tag);
        return Buffer.concat([decipher.update(text), decipher.final()]);
      } catch {
        // Wrong key with this id, tampered, or another record's: try the next key.
      }
    }
    throw new Error('sealed bytes failed authentication (wrong key, tampered, or another record)');
  }

  /**
   * `<key id>:<base64url HMAC-SHA256>` over `parts` under a key derived from the current cache
   * key: what the idempotency store keeps next to an answer it will replay.
   */
  mac(parts: readonly (string | Buffer)[]): string {
    return `${this.current.id}:${hmacOf(macKey(this.current.key), parts)}`;
  }

  /** Whether `tag` is a {@link mac} of `parts` under any configured key (rotation). */
  verifyMac(parts: readonly (string | Buffer)[], tag: string): boolean {
    const colon = tag.indexOf(':');
    const keys = colon > 0 ? this.macKeysById.get(tag.slice(0, colon)) : undefined;
    if (keys === undefined) return false;
    const given = Buffer.from(tag.slice(colon + 1), 'latin1');
    return keys.some((key) => {
      const expected = Buffer.from(hmacOf(key, parts), 'latin1');
      return expected.length === given.length && timingSafeEqual(expected, given);
    });
  }
}

/** The associated data of a `gcm2:` value. */
function associatedData(clientId: string, context: string): Buffer {
  // The client id cannot contain a NUL (config validation), so the split is unambiguous.
  return Buffer.from(context === '' ? clientId : `${clientId}\u0000${context}`, 'utf8');
}

/**
 * The associated data of a `gcm3:` value: its parts length-prefixed, so no two lists encode
 * alike. It starts with a zero byte and `gcm2:` data with the client id (never empty, never a
 * NUL), so a value relabelled from one version to the other cannot open either.
 */
function boundData(clientId: string, context: string, generation: number): Buffer {
  return lengthPrefixed(['gcm3', clientId, context, String(generation)]);
}

function macKey(key: Buffer): Buffer {
  return createHmac('sha256', key).update(MAC_LABEL).digest();
}

/** Each part length-prefixed, so that no two different lists hash alike. */
function hmacOf(key: Buffer, parts: readonly (string | Buffer)[]): string {
  return createHmac('sha256', key).update(lengthPrefixed(parts)).digest('base64url');
}

/** Each part as a 4-byte big-endian length, then its bytes. */
function lengthPrefixed(parts: readonly (string | Buffer)[]): Buffer {
  const chunks: Buffer[] = [];
  for (const part of parts) {
    const bytes = typeof part === 'string' ? Buffer.from(part, 'utf8') : part;
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    chunks.push(length, bytes);
  }
  return Buffer.concat(chunks);
}
