import { type DynamicModule, Module, type Type } from '@nestjs/common';
import { CallerAuthGuard } from '../caller-auth/caller-auth.guard';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { MetricsModule } from '../metrics/metrics.module';
import { ProviderModule } from '../provider/provider.module';
import { ForwardingRoute } from './forwarding.route';

@Module({
  imports: [CallerAuthModule, MetricsModule, ProviderModule],
  providers: [CallerAuthGuard, ForwardingRoute],
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
