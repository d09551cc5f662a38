import { type DynamicModule, Module, type Type } from '@nestjs/common';
import type { Logger } from 'pino';
import { CallerAuthGuard } from '../caller-auth/caller-auth.guard';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { MetricsModule } from '../metrics/metrics.module';
import { MetricsService } from '../metrics/metrics.service';
import type { CheckoutGateway } from '../provider/checkout.client';
import { CHECKOUT_GATEWAY } from '../provider/provider.constants';
import { ProviderModule } from '../provider/provider.module';
import { TokenService } from '../token/token.service';
import type { IdempotencyStore } from './idempotency-store';
import { IDEMPOTENCY_STORE } from './orders.constants';
import { OrdersRoute } from './orders.route';
import { OrdersService } from './orders.service';

/**
 * `POST /orders`: the checkout passthrough with idempotency. Its ports come from the adapters
 * (the checkout gateway from the provider module, the idempotency store from the shared-store
 * module), which build and close them. Build it with {@link OrdersModule.with}.
 */
@Module({
  imports: [CallerAuthModule, MetricsModule, ProviderModule],
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
  ],
})
export class OrdersModule {
  /**
   * This module with the app's token module (`TokenModule.withStore(...)`, the same instance
   * the app imports) and `store`, the module exporting `IDEMPOTENCY_STORE`. The store
   * implements this folder's port, so this folder cannot import it (a folder cycle).
   */
  static with(token: DynamicModule, store: Type): DynamicModule {
    return { module: OrdersModule, imports: [token, store] };
  }
}
