import { type DynamicModule, Module } from '@nestjs/common';
import { CallerAuthModule } from '../caller-auth/caller-auth.module';
import { AdminController } from './admin.controller';
import { AdminService } from './admin.service';

/** Served on the admin listener when `http.adminPort` is set. */
@Module({
  imports: [CallerAuthModule],
  controllers: [AdminController],
  providers: [AdminService],
})
export class AdminModule {
  /** The same token module instance the app imports. */
  static with(token: DynamicModule): DynamicModule {
    return { module: AdminModule, imports: [token] };
  }
}
