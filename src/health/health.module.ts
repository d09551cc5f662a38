import { type DynamicModule, Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { DrainState } from './drain-state';
import { HealthController } from './health.controller';

/** Built with {@link HealthModule.with} and the app's token module. */
@Module({
  imports: [TerminusModule.forRoot({ logger: false })],
  controllers: [HealthController],
  providers: [DrainState],
  exports: [DrainState],
})
export class HealthModule {
  static with(token: DynamicModule): DynamicModule {
    return { module: HealthModule, imports: [token] };
  }
}
