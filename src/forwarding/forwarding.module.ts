import { type DynamicModule, Module, type Type } from '@nestjs/common';
import { CallerAuthGuard } from '../caller-auth/caller-auth.guard';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { BROKER_CONFIG } from '../config/config.constants';
import { LOGGER } from '../logging/logger';
import { MetricsModule } from '../metrics/metrics.module';
import { MetricsService } from '../metrics/metrics.service';
import { PROVIDER_API_GATEWAY } from '../provider/provider.constants';
import { ProviderModule } from '../provider/provider.module';
import { TokenService } from '../token/token.service';
import { IDEMPOTENCY_STORE } from './forwarding.constants';
import { ForwardingRoute } from './forwarding.route';
import { ForwardingService } from './forwarding.service';

@Module({
  imports: [CallerAuthModule, MetricsModule, ProviderModule],
  providers: [
    CallerAuthGuard,
    ForwardingRoute,
    {
      provide: ForwardingService,
      inject: [
        TokenService,
        PROVIDER_API_GATEWAY,
        IDEMPOTENCY_STORE,
        BROKER_CONFIG,
        MetricsService,
        LOGGER,
      ],
      useFactory: (...ports: ConstructorParameters<typeof ForwardingService>) =>
        new ForwardingService(...ports),
    },
  ],
})
export class ForwardingModule {
  /**
   * `store` exports `IDEMPOTENCY_STORE` and `FORWARD_RATE_LIMITER`; it implements this folder's
   * ports, so this folder cannot import it (a folder cycle).
   */
  static with(token: DynamicModule, store: Type): DynamicModule {
    return { module: ForwardingModule, imports: [token, store] };
  }
}
