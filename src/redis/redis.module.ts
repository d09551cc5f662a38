import { Global, Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Logger } from 'pino';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { TOKEN_CIPHER, type TokenCipher } from '../token/token-cipher';
import { TOKEN_STORE, type TokenStore } from '../token/token-store';
import { MemoryTokenStore } from '../token/token-store.memory';
import { SECRET_READER } from '../secrets/secrets.constants';
import { createTokenCipher } from '../token/token-cipher.factory';
import { REDIS_CONNECTION } from './redis.constants';
import { createRedisConnection } from './redis.connection';
import { RedisTokenStore } from './token-store.redis';

/**
 * The shared-store adapter. With `REDIS_URL`: Redis (token store, and the connection other
 * features share). Without: process memory, valid for a single replica only.
 */
@Global()
@Module({
  providers: [
    {
      provide: REDIS_CONNECTION,
      inject: [BROKER_CONFIG],
      useFactory: (config: BrokerConfig) =>
        config.redis.url ? createRedisConnection(config.redis, 'command') : null,
    },
    {
      // AES-256-GCM with the configured key(s); plain (with a warning) when none is set.
      provide: TOKEN_CIPHER,
      inject: [BROKER_CONFIG, SECRET_READER, LOGGER],
      useFactory: createTokenCipher,
    },
    {
      provide: TOKEN_STORE,
      inject: [BROKER_CONFIG, REDIS_CONNECTION, TOKEN_CIPHER, LOGGER],
      useFactory: (
        config: BrokerConfig,
        redis: ReturnType<typeof createRedisConnection> | null,
        cipher: TokenCipher,
        logger: Logger,
      ): TokenStore => {
        if (!redis) {
          logger.warn(
            'REDIS_URL is not set: using an in-memory token store. Run a single replica only; several replicas would each fetch their own token.',
          );
          return new MemoryTokenStore();
        }
        return new RedisTokenStore(
          redis,
          createRedisConnection(config.redis, 'subscriber'),
          cipher,
          config.redis,
          config.token.lockTtlMs,
          config.clients.map((c) => c.id),
        );
      },
    },
  ],
  exports: [REDIS_CONNECTION, TOKEN_STORE, TOKEN_CIPHER],
})
export class RedisModule implements OnApplicationShutdown {
  constructor(@Inject(TOKEN_STORE) private readonly store: TokenStore) {}

  async onApplicationShutdown(): Promise<void> {
    await this.store.close();
  }
}
