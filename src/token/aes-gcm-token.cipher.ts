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
 * `gcm3:<key id>:<base64url(iv ‖ ciphertext ‖ tag)>`. `gcm2:` (no generation) is still read: old
 * and new replicas share Redis during a rolling upgrade. `gcm1:` (client id only: anyone who can
 * write Redis could pin its expiry) is refused.
 */
const PREFIX = 'gcm3:';
const UNBOUND_PREFIX = 'gcm2:';
const BYTES_PREFIX = 'gcmb:';
/** The MAC key is derived from each cache key, never the encryption key itself. */
const MAC_LABEL = 'token-broker record mac';

/** Derived, not configured: it can never point at the wrong key, and reveals nothing about it. */
export function cacheKeyId(key: Buffer): string {
  return createHmac('sha256', key).update('token-broker cache key id').digest('hex').slice(0, 8);
}

/**
 * AES-256-GCM with a random IV per value; the key id is in clear so values written before a
 * rotation open with whichever configured key wrote them.
 */
export class AesGcmTokenCipher implements TokenCipher {
  readonly currentKeyId: string;
  private readonly currentKey: Buffer;
  private readonly byId = new Map<string, Buffer[]>();
  readonly authenticates = true;

  /** `previous` keys only read (values written before a rotation). */
  constructor(current: Buffer, previous: readonly Buffer[] = []) {
    for (const key of [current, ...previous]) {
      if (key.length !== KEY_BYTES) throw new RangeError(`AES-256 keys are ${KEY_BYTES} bytes`);
      const id = cacheKeyId(key);
      // Two distinct keys could share an 8-digit id; opening then simply tries both.
      this.byId.set(id, [...(this.byId.get(id) ?? []), key]);
    }
    this.currentKeyId = cacheKeyId(current);
    this.currentKey = current;
  }

  get keyIds(): string[] {
    return [...this.byId.keys()];
  }

  seal(clientId: string, accessToken: string, context = '', generation = 0): string {
    const aad = boundData(clientId, context, generation);
    const body = encrypt(this.currentKey, aad, Buffer.from(accessToken, 'utf8'));
    return `${PREFIX}${this.currentKeyId}:${body.toString('base64url')}`;
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
    const opened = decrypt(keys, aad, Buffer.from(sealed.slice(idEnd + 1), 'base64url'));
    if (opened !== undefined) return opened.toString('utf8');
    throw new Error(
      'sealed value failed authentication (wrong key, tampered, another client or generation)',
    );
  }

  /** `context` is the associated data: the value only opens for the record it was written for. */
  sealBytes(context: readonly string[], bytes: Buffer): Buffer {
    return Buffer.concat([
      Buffer.from(`${BYTES_PREFIX}${this.currentKeyId}:`, 'latin1'),
      encrypt(this.currentKey, lengthPrefixed(context), bytes),
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
    const opened = decrypt(keys, lengthPrefixed(context), sealed.subarray(header));
    if (opened !== undefined) return opened;
    throw new Error('sealed bytes failed authentication (wrong key, tampered, or another record)');
  }

  /** What the idempotency store keeps next to an answer it will replay. */
  mac(parts: readonly (string | Buffer)[]): string {
    return `${this.currentKeyId}:${hmacOf(macKey(this.currentKey), parts)}`;
  }

  /** Under any configured key (rotation). */
  verifyMac(parts: readonly (string | Buffer)[], tag: string): boolean {
    const colon = tag.indexOf(':');
    const keys = colon > 0 ? this.byId.get(tag.slice(0, colon)) : undefined;
    if (keys === undefined) return false;
    const given = Buffer.from(tag.slice(colon + 1), 'latin1');
    return keys.some((key) => {
      const expected = Buffer.from(hmacOf(macKey(key), parts), 'latin1');
      return expected.length === given.length && timingSafeEqual(expected, given);
    });
  }
}

/** `iv ‖ ciphertext ‖ tag`, with a random IV. */
function encrypt(key: Buffer, aad: Buffer, plain: Buffer): Buffer {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv(ALGORITHM, key, iv, { authTagLength: TAG_BYTES });
  cipher.setAAD(aad);
  return Buffer.concat([iv, cipher.update(plain), cipher.final(), cipher.getAuthTag()]);
}

/** Undefined when no key opens it. */
function decrypt(keys: readonly Buffer[], aad: Buffer, body: Buffer): Buffer | undefined {
  if (body.length < IV_BYTES + TAG_BYTES) throw new Error('sealed value too short');
  const iv = body.subarray(0, IV_BYTES);
  const tag = body.subarray(body.length - TAG_BYTES);
  const text = body.subarray(IV_BYTES, body.length - TAG_BYTES);
  for (const key of keys) {
    try {
      const decipher = createDecipheriv(ALGORITHM, key, iv, { authTagLength: TAG_BYTES });
      decipher.setAAD(aad);
      decipher.setAuthTag(tag);
      return Buffer.concat([decipher.update(text), decipher.final()]);
    } catch {
      // Wrong key with this id, tampered, or another client's or record's: try the next key.
    }
  }
  return undefined;
}

function associatedData(clientId: string, context: string): Buffer {
  // The client id cannot contain a NUL (config validation), so the split is unambiguous.
  return Buffer.from(context === '' ? clientId : `${clientId}\u0000${context}`, 'utf8');
}

/**
 * `gcm3:` data starts with a zero byte and `gcm2:` with the client id (never empty), so a value
 * relabelled from one version to the other cannot open either.
 */
function boundData(clientId: string, context: string, generation: number): Buffer {
  return lengthPrefixed(['gcm3', clientId, context, String(generation)]);
}

function macKey(key: Buffer): Buffer {
  return createHmac('sha256', key).update(MAC_LABEL).digest();
}

function hmacOf(key: Buffer, parts: readonly (string | Buffer)[]): string {
  return createHmac('sha256', key).update(lengthPrefixed(parts)).digest('base64url');
}

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
