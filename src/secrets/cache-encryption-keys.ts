import type { CredentialsSource } from '../config/client.schema';
import { parseSecretJson, readSource, type SecretReader } from './secret-reader';
import { SecretsException } from './secrets.exception';

/** `current` writes, every key reads. Never log this object. */
interface CacheKeys {
  readonly current: Buffer;
  readonly previous: readonly Buffer[];
}

const KEY_BYTES = 32;
/** Standard or URL-safe base64 (Node's decoder reads both), padding optional. */
const BASE64 = /^[A-Za-z0-9+/_-]+={0,2}$/;
const SETTING = 'CACHE_KEY_SECRET_ID / CACHE_KEY_FILE (cacheEncryption.key)';
const HOW = 'generate one with `openssl rand -base64 32`';

/** One base64 32-byte key, or a keyring `{"current": ..., "previous": [...]}` for rotation. */
export async function loadCacheKeys(
  reader: SecretReader,
  source: CredentialsSource,
): Promise<CacheKeys> {
  const { text: raw, where } = await readSource(reader, source);
  const text = raw.trim();
  if (!text.startsWith('{')) return { current: decodeKey(text, where, 'the key'), previous: [] };
  const json = parseSecretJson(text, where, `the keyring in "${where}" (${SETTING}) is not JSON`);
  const ring = json as { current?: unknown; previous?: unknown };
  const previous = ring.previous ?? [];
  if (typeof ring.current !== 'string' || !Array.isArray(previous)) {
    throw SecretsException.malformed(
      where,
      `the keyring in "${where}" (${SETTING}) must be {"current": "<base64 key>", "previous": ["<base64 key>", ...]}`,
    );
  }
  return {
    current: decodeKey(ring.current, where, '"current"'),
    previous: previous.map((k: unknown, i) =>
      decodeKey(typeof k === 'string' ? k : '', where, `"previous"[${i}]`),
    ),
  };
}

function decodeKey(text: string, where: string, which: string): Buffer {
  const value = text.trim();
  const key = BASE64.test(value) ? Buffer.from(value, 'base64') : undefined;
  if (key?.length !== KEY_BYTES) {
    // The length is safe to print and tells a hex or truncated key apart; the value is not.
    const got = key ? `it decodes to ${key.length} bytes` : 'it is not base64';
    throw SecretsException.malformed(
      where,
      `${which} in "${where}" (${SETTING}) must be a base64-encoded ${KEY_BYTES}-byte AES-256 key, but ${got}; ${HOW}`,
    );
  }
  return key;
}
