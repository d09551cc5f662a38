import { type DynamicModule, Module, type Type } from '@nestjs/common';
import type { Logger } from 'pino';
import { CallerAuthGuard } from '../caller-auth/caller-auth.guard';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { MetricsModule } from '../metrics/metrics.module';
import { MetricsService } from '../metrics/metrics.service';
import type { IdempotencyStore } from './idempotency-store';
import { IDEMPOTENCY_STORE } from './orders.constants';
import type { ProviderApiGateway } from '../provider/provider-api.client';
import { PROVIDER_API_GATEWAY } from '../provider/provider.constants';
import { ProviderModule } from '../provider/provider.module';
import { TokenService } from '../token/token.service';
import { ForwardRoute } from './forward.route';
import { ForwardService } from './forward.service';

/**
 * `/provider/<client>/...`: the provider passthrough. Its ports come from the adapters: the
 * provider API gateway, and from the shared-store module the idempotency store and the rate
 * limiter (`FORWARD_RATE_LIMITER`). Build it with {@link ForwardModule.with}.
 */
@Module({
  imports: [CallerAuthModule, MetricsModule, ProviderModule],
  providers: [
    CallerAuthGuard,
    ForwardRoute,
    {
      provide: ForwardService,
      inject: [
        TokenService,
        PROVIDER_API_GATEWAY,
        IDEMPOTENCY_STORE,
        BROKER_CONFIG,
        MetricsService,
        LOGGER,
      ],
      useFactory: (
        tokens: TokenService,
        api: ProviderApiGateway,
        store: IdempotencyStore,
        config: BrokerConfig,
        metrics: MetricsService,
        logger: Logger,
      ) => new ForwardService(tokens, api, store, config, metrics, logger),
    },
  ],
})
export class ForwardModule {
  /** As `OrdersModule.with`: the app's token module and the module exporting the stores. */
  static with(token: DynamicModule, store: Type): DynamicModule {
    return { module: ForwardModule, imports: [token, store] };
  }
}
