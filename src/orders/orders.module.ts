import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { CallerAuthGuard } from '../caller-auth/caller-auth.guard';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import {
  CheckoutClient,
  type CheckoutGateway,
  createCheckoutAgent,
} from '../provider/checkout.client';
import { RedisIdempotencyStore } from '../redis/idempotency-store.redis';
import { REDIS_CONNECTION } from '../redis/redis.constants';
import { MetricsService } from '../metrics/metrics.service';
import { TokenModule } from '../token/token.module';
import { TokenService } from '../token/token.service';
import type { IdempotencyStore } from './idempotency-store';
import { MemoryIdempotencyStore } from './idempotency-store.memory';
import { CHECKOUT_GATEWAY, IDEMPOTENCY_STORE } from './orders.constants';
import { OrdersRoute } from './orders.route';
import { OrdersService } from './orders.service';

/** `POST /orders`: the checkout passthrough with idempotency. */
@Module({
  imports: [TokenModule],
  providers: [
    CallerAuthGuard,
    OrdersRoute,
    {
      provide: OrdersService,
      inject: [
        TokenService,
        CHECKOUT_GATEWAY,
        IDEMPOTENCY_STORE,
        BROKER_CONFIG,
        MetricsService,
        LOGGER,
      ],
      useFactory: (
        tokens: TokenService,
        checkout: CheckoutGateway,
        store: IdempotencyStore,
        config: BrokerConfig,
        metrics: MetricsService,
        logger: Logger,
      ) => new OrdersService(tokens, checkout, store, config, metrics, logger),
    },
    {
      provide: CHECKOUT_GATEWAY,
      inject: [BROKER_CONFIG],
      useFactory: (config: BrokerConfig): CheckoutGateway =>
        new CheckoutClient(createCheckoutAgent(config.orders), config.orders),
    },
    {
      provide: IDEMPOTENCY_STORE,
      inject: [REDIS_CONNECTION, LOGGER],
      useFactory: (redis: Redis | null, logger: Logger): IdempotencyStore => {
        if (redis) return new RedisIdempotencyStore(redis);
        logger.warn(
          'REDIS_URL is not set: Idempotency-Key outcomes are kept in this process only and are lost on restart.',
        );
        return new MemoryIdempotencyStore();
      },
    },
  ],
})
export class OrdersModule implements OnApplicationShutdown {
  constructor(
    @Inject(CHECKOUT_GATEWAY) private readonly checkout: CheckoutGateway,
    @Inject(IDEMPOTENCY_STORE) private readonly store: IdempotencyStore,
  ) {}

  async onApplicationShutdown(): Promise<void> {
    await Promise.all([this.checkout.close(), this.store.close()]);
  }
}
