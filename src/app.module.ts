import { type DynamicModule, Module } from '@nestjs/common';
import { AdminModule } from './admin/admin.module';
import { APP_FILTER } from '@nestjs/core';
import type { Logger } from 'pino';
import { CallerAuthModule } from './caller-auth/caller-auth.module';
import { ConfigModule } from './config/config.module';
import type { BrokerConfig } from './config/config.schema';
import { ForwardingModule } from './forwarding/forwarding.module';
import { HealthModule } from './health/health.module';
import { OpenApiRoute } from './openapi/openapi.route';
import { ProblemFilter } from './http/problem.reply';
import { LoggingModule } from './logging/logging.module';
import { MetricsModule } from './metrics/metrics.module';
import { ProviderModule } from './provider/provider.module';
import { RedisModule } from './redis/redis.module';
import { SecretsModule } from './secrets/secrets.module';
import { TokenModule } from './token/token.module';

@Module({})
export class AppModule {
  static forRoot(config: BrokerConfig, logger: Logger): DynamicModule {
    // The store implements ports the token and forwarding folders declare, so it is handed in
    // here. One token module object: Nest keys dynamic modules by reference, one TokenService.
    const token = TokenModule.withStore(RedisModule);
    return {
      module: AppModule,
      imports: [
        ConfigModule.forRoot(config),
        LoggingModule.forRoot(logger),
        MetricsModule,
        SecretsModule,
        ProviderModule,
        RedisModule,
        CallerAuthModule,
        token,
        ForwardingModule.with(token, RedisModule),
        HealthModule.with(token),
        AdminModule.with(token),
      ],
      providers: [{ provide: APP_FILTER, useClass: ProblemFilter }, OpenApiRoute],
    };
  }
}
