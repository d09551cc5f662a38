import type { Logger } from 'pino';
import type { BrokerConfig } from '../config/config.schema';
import { redisConfigured } from '../config/redis.schema';
import { loadCacheKeys } from '../secrets/cache-encryption-keys';
import type { SecretReader } from '../secrets/secret-reader';
import { AesGcmTokenCipher } from './aes-gcm-token.cipher';
import { PlainTokenCipher, type TokenCipher } from './token-cipher';

/** Clear text only with a loud warning (the schema refuses that with Redis in production). */
export async function createTokenCipher(
  config: BrokerConfig,
  secrets: SecretReader,
  logger: Logger,
): Promise<TokenCipher> {
  const source = config.cacheEncryption.key;
  if (source === undefined) {
    if (redisConfigured(config.redis)) {
      logger.warn(
        'CACHE ENCRYPTION IS OFF: the token is stored in Redis in clear, so anyone who can read Redis can use it. Set CACHE_KEY_SECRET_ID or CACHE_KEY_FILE (a base64 32-byte key); NODE_ENV=production refuses to start without one.',
      );
    }
    return new PlainTokenCipher();
  }
  const keys = await loadCacheKeys(secrets, source);
  const cipher = new AesGcmTokenCipher(keys.current, keys.previous);
  logger.info(
    { currentKeyId: cipher.currentKeyId, readableKeyIds: cipher.keyIds },
    'cache encryption: AES-256-GCM',
  );
  return cipher;
}
