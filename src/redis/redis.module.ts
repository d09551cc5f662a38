import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Logger } from 'pino';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { redisConfigured } from '../config/redis.schema';
import { LOGGER } from '../logging/logger';
import type { IdempotencyStore } from '../forwarding/idempotency-store';
import { MemoryIdempotencyStore } from '../forwarding/idempotency-store.memory';
import {
  FORWARD_RATE_LIMITER,
  IDEMPOTENCY_STORE,
  ORDERS_RATE_LIMITER,
} from '../forwarding/forwarding.constants';
import { TOKEN_CIPHER, type TokenCipher } from '../token/token-cipher';
import { TOKEN_STORE, type TokenStore } from '../token/token-store';
import { MemoryTokenStore } from '../token/token-store.memory';
import { SECRET_READER, type SecretReader } from '../secrets/secret-reader';
import { SecretsModule } from '../secrets/secrets.module';
import { createTokenCipher } from '../token/token-cipher.factory';
import { RedisIdempotencyStore } from './idempotency-store.redis';
import type { ForwardRateLimiter } from '../forwarding/forward-rate-limiter';
import { RedisForwardRateLimiter } from './forward-rate-limiter.redis';
import {
  createRedisConnection,
  type RedisClient,
  type RedisSecrets,
  readRedisSecrets,
} from './redis.connection';
import { RedisTokenStore } from './token-store.redis';
import { DPOP_STORE, type DpopStore, MemoryDpopStore } from '../dpop/dpop-store';
import { RedisDpopStore } from './dpop-store.redis';

/** The shared command connection, absent without a Redis. */
const REDIS_CONNECTION = 'TOKEN_BROKER:REDIS_CONNECTION';
/** The Redis passwords, read once at start-up. */
const REDIS_SECRETS = 'TOKEN_BROKER:REDIS_SECRETS';

/** Without a Redis configured: process memory, valid for a single replica only. */
@Module({
  imports: [SecretsModule],
  providers: [
    {
      // Read at start-up, so a missing secret stops the broker with its name.
      provide: REDIS_SECRETS,
      inject: [BROKER_CONFIG, SECRET_READER],
      useFactory: (config: BrokerConfig, secrets: SecretReader): Promise<RedisSecrets> =>
        readRedisSecrets(config.redis, secrets),
    },
    {
      provide: REDIS_CONNECTION,
      inject: [BROKER_CONFIG, REDIS_SECRETS],
      useFactory: (config: BrokerConfig, secrets: RedisSecrets): RedisClient | null =>
        redisConfigured(config.redis)
          ? createRedisConnection(config.redis, 'command', secrets)
          : null,
    },
    {
      provide: TOKEN_CIPHER,
      inject: [BROKER_CONFIG, SECRET_READER, LOGGER],
      useFactory: createTokenCipher,
    },
    {
      provide: TOKEN_STORE,
      inject: [BROKER_CONFIG, REDIS_CONNECTION, REDIS_SECRETS, TOKEN_CIPHER, LOGGER],
      useFactory: (
        config: BrokerConfig,
        redis: RedisClient | null,
        secrets: RedisSecrets,
        cipher: TokenCipher,
        logger: Logger,
      ): TokenStore => {
        if (!redis) {
          logger.warn(
            'No Redis configured (REDIS_URL, or REDIS_MODE sentinel/cluster): using an in-memory token store. Run a single replica only; several replicas would each fetch their own token.',
          );
          return new MemoryTokenStore();
        }
        return new RedisTokenStore(
          redis,
          createRedisConnection(config.redis, 'subscriber', secrets),
          cipher,
          config.redis,
          config.token.lockTtlMs,
          config.clients.map((c) => c.id),
          logger,
        );
      },
    },
    {
      provide: IDEMPOTENCY_STORE,
      inject: [REDIS_CONNECTION, TOKEN_CIPHER, LOGGER],
      useFactory: (
        redis: RedisClient | null,
        cipher: TokenCipher,
        logger: Logger,
      ): IdempotencyStore => {
        if (redis) return new RedisIdempotencyStore(redis, cipher);
        logger.warn(
          'No Redis configured: Idempotency-Key outcomes are kept in this process only and are lost on restart.',
        );
        return new MemoryIdempotencyStore();
      },
    },
    {
      provide: DPOP_STORE,
      inject: [REDIS_CONNECTION, TOKEN_CIPHER],
      useFactory: (redis: RedisClient | null, cipher: TokenCipher): DpopStore =>
        redis ? new RedisDpopStore(redis, cipher) : new MemoryDpopStore(),
    },
    {
      provide: FORWARD_RATE_LIMITER,
      inject: [BROKER_CONFIG, REDIS_CONNECTION, LOGGER],
      useFactory: (
        config: BrokerConfig,
        redis: RedisClient | null,
        logger: Logger,
      ): ForwardRateLimiter => new RedisForwardRateLimiter(redis, config.forward, logger),
    },
    {
      provide: ORDERS_RATE_LIMITER,
      inject: [BROKER_CONFIG, REDIS_CONNECTION, LOGGER],
      useFactory: (
        config: BrokerConfig,
        redis: RedisClient | null,
        logger: Logger,
      ): ForwardRateLimiter => new RedisForwardRateLimiter(redis, config.orders, logger, 'orders'),
    },
  ],
  exports: [TOKEN_STORE, IDEMPOTENCY_STORE, FORWARD_RATE_LIMITER, ORDERS_RATE_LIMITER, DPOP_STORE],
})
export class RedisModule implements OnApplicationShutdown {
  constructor(
    @Inject(TOKEN_STORE) private readonly store: TokenStore,
    @Inject(IDEMPOTENCY_STORE) private readonly idempotency: IdempotencyStore,
  ) {}

  async onApplicationShutdown(): Promise<void> {
    await Promise.all([this.store.health.close(), this.idempotency.close()]);
  }
}
