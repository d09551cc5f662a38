import { type DynamicModule, Module, type Type } from '@nestjs/common';
import type { Logger } from 'pino';
import { CallerAuthGuard } from '../caller-auth/caller-auth.guard';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { MetricsModule } from '../metrics/metrics.module';
import { MetricsService } from '../metrics/metrics.service';
import type { ProviderApiClient } from '../provider/provider-api.client';
import { PROVIDER_API_GATEWAY } from '../provider/provider.constants';
import { ProviderModule } from '../provider/provider.module';
import { TokenService } from '../token/token.service';
import { ForwardRoute } from './forward.route';
import { ForwardService } from './forward.service';
import { IDEMPOTENCY_STORE } from './forwarding.constants';
import type { IdempotencyStore } from './idempotency-store';
import { OrdersRoute } from './orders.route';
import { OrdersService } from './orders.service';

const SERVICE_PORTS = [
  TokenService,
  PROVIDER_API_GATEWAY,
  IDEMPOTENCY_STORE,
  BROKER_CONFIG,
  MetricsService,
  LOGGER,
];
type ServicePorts = [
  TokenService,
  ProviderApiClient,
  IdempotencyStore,
  BrokerConfig,
  MetricsService,
  Logger,
];

/**
 * `POST /orders` and `/provider/<client>/...`: the two routes of the forwarding core. Its ports
 * come from the adapters: the provider API client, and from the shared-store module the
 * idempotency store and the rate limiter (`FORWARD_RATE_LIMITER`). Build it with
 * {@link ForwardingModule.with}.
 */
@Module({
  imports: [CallerAuthModule, MetricsModule, ProviderModule],
  providers: [
    CallerAuthGuard,
    OrdersRoute,
    ForwardRoute,
    {
      provide: OrdersService,
      inject: SERVICE_PORTS,
      useFactory: (...ports: ServicePorts) => new OrdersService(...ports),
    },
    {
      provide: ForwardService,
      inject: SERVICE_PORTS,
      useFactory: (...ports: ServicePorts) => new ForwardService(...ports),
    },
  ],
})
export class ForwardingModule {
  /**
   * This module with the app's token module (`TokenModule.withStore(...)`, the same instance
   * the app imports) and `store`, the module exporting `IDEMPOTENCY_STORE` and
   * `FORWARD_RATE_LIMITER`. The store implements this folder's ports, so this folder cannot
   * import it (a folder cycle).
   */
  static with(token: DynamicModule, store: Type): DynamicModule {
    return { module: ForwardingModule, imports: [token, store] };
  }
}
