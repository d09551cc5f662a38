import { type DynamicModule, Module } from '@nestjs/common';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { MetricsModule } from '../metrics/metrics.module';
import { AdminController } from './admin.controller';
import { AdminService } from './admin.service';
import { MetricsController } from './metrics.controller';

/** Served on the admin listener when `http.adminPort` is set, `/metrics` with them. */
@Module({
  imports: [CallerAuthModule, MetricsModule],
  controllers: [AdminController, MetricsController],
  providers: [AdminService],
})
export class AdminModule {
  /** The same token module instance the app imports. */
  static with(token: DynamicModule): DynamicModule {
    return { module: AdminModule, imports: [token] };
  }
}
