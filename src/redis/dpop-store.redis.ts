import { DpopKeyError, type DpopStore, NONCE_TTL_MS, type NonceServer } from '../dpop/dpop-store';
import type { TokenCipher } from '../token/token-cipher';
import type { RedisClient } from './redis.connection';
import { redisKeys } from './redis.constants';

/** Bound into the sealed key: a sealed token cannot pass for a key, nor one client's for another's. */
const KEY_CONTEXT = 'dpop-key';

/**
 * The fleet's DPoP state: each generated key sealed with the cache encryption key, written with
 * SET NX so the first replica's key is the fleet's, and each server's last nonce.
 */
export class RedisDpopStore implements DpopStore {
  constructor(
    private readonly redis: RedisClient,
    private readonly cipher: Pick<TokenCipher, 'authenticates' | 'seal' | 'open'>,
  ) {}

  async claimKey(clientId: string, generate: () => string): Promise<string> {
    if (!this.cipher.authenticates) {
      throw new DpopKeyError(
        'a generated key would be stored in Redis in clear; set CACHE_KEY_SECRET_ID or CACHE_KEY_FILE (the cache encryption key), or give the key with dpop.key.secretId or dpop.key.file',
        { permanent: true },
      );
    }
    const key = redisKeys.dpopKey(clientId);
    let sealed = await this.redis.get(key);
    if (sealed === null) {
      await this.redis.set(key, this.cipher.seal(clientId, generate(), KEY_CONTEXT), 'NX');
      // Whoever won, the fleet uses what is stored.
      sealed = await this.redis.get(key);
      if (sealed === null) throw new Error('the stored key vanished from Redis as it was written');
    }
    try {
      return this.cipher.open(clientId, sealed, KEY_CONTEXT);
    } catch {
      throw new DpopKeyError(
        `the key stored in Redis (${key}) does not open with the cache encryption key; if the cache key was replaced without keeping the old one as previous, delete ${key} so a new key is generated`,
        { permanent: true },
      );
    }
  }

  async nonce(clientId: string, server: NonceServer, origin: string) {
    return (await this.redis.get(redisKeys.dpopNonce(clientId, server, origin))) ?? undefined;
  }

  async learnNonce(clientId: string, server: NonceServer, origin: string, nonce: string) {
    await this.redis.set(redisKeys.dpopNonce(clientId, server, origin), nonce, 'PX', NONCE_TTL_MS);
  }
}
