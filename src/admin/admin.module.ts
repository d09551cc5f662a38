import { type DynamicModule, Module } from '@nestjs/common';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { AdminController } from './admin.controller';
import { AdminService } from './admin.service';

/**
 * The operators' routes (`/admin/*`, scope `admin`), served on the admin listener when
 * `http.adminPort` is set. Build it with {@link AdminModule.with} and the app's token module.
 */
@Module({
  imports: [CallerAuthModule],
  controllers: [AdminController],
  providers: [AdminService],
})
export class AdminModule {
  /** This module reading the app's token module (the same instance the app imports). */
  static with(token: DynamicModule): DynamicModule {
    return { module: AdminModule, imports: [token] };
  }
}
