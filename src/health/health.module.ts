import { type DynamicModule, Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { HealthController } from './health.controller';

/** Liveness and readiness; build it with {@link HealthModule.with} and the app's token module. */
@Module({
  imports: [TerminusModule.forRoot({ logger: false })],
  controllers: [HealthController],
})
export class HealthModule {
  /** This module reading the app's token module (the same instance the app imports). */
  static with(token: DynamicModule): DynamicModule {
    return { module: HealthModule, imports: [token] };
  }
}
