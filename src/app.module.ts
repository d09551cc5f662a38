import { type DynamicModule, Module } from '@nestjs/common';
import { AdminModule } from './admin/admin.module';
import { APP_FILTER } from '@nestjs/core';
import type { Logger } from 'pino';
import { CallerAuthModule } from './caller-auth/caller-auth.module';
import { BROKER_CONFIG } from './config/config.constants';
import { CONFIG_RELOADER, ConfigReloader } from './config/config-reload';
import type { BrokerConfig } from './config/config.schema';
import { DpopModule } from './dpop/dpop.module';
import { ForwardingModule } from './forwarding/forwarding.module';
import { HealthModule } from './health/health.module';
import { OpenApiRoute } from './openapi/openapi.route';
import { ProblemFilter } from './http/problem.reply';
import { LOGGER } from './logging/logger';
import { MetricsModule } from './metrics/metrics.module';
import { ProviderModule } from './provider/provider.module';
import { RedisModule } from './redis/redis.module';
import { SecretsModule } from './secrets/secrets.module';
import { TokenModule } from './token/token.module';

@Module({})
export class AppModule {
  /**
   * `config` is validated before Nest starts (`main.ts`), so a bad setting stops the process with
   * a clear message instead of a DI stack trace. It and `logger` (the instance Fastify logs
   * with) are provided globally. `env`: where `config` was read from, re-read by a reload.
   */
  static forRoot(
    config: BrokerConfig,
    logger: Logger,
    env?: Readonly<Record<string, string | undefined>>,
  ): DynamicModule {
    // The store implements ports the token and forwarding folders declare, so it is handed in
    // here. One token module object: Nest keys dynamic modules by reference, one TokenService.
    const token = TokenModule.withStore(RedisModule);
    return {
      module: AppModule,
      global: true,
      imports: [
        MetricsModule,
        SecretsModule,
        DpopModule.withStore(RedisModule),
        ProviderModule,
        RedisModule,
        CallerAuthModule,
        token,
        ForwardingModule.with(token, RedisModule),
        HealthModule.with(token),
        AdminModule.with(token),
      ],
      providers: [
        { provide: BROKER_CONFIG, useValue: config },
        // Re-reads `env` (and its BROKER_CONFIG_FILE) on a reload; without it, nothing to re-read.
        { provide: CONFIG_RELOADER, useValue: new ConfigReloader(config, env) },
        { provide: LOGGER, useValue: logger },
        { provide: APP_FILTER, useClass: ProblemFilter },
        OpenApiRoute,
      ],
      exports: [BROKER_CONFIG, CONFIG_RELOADER, LOGGER],
    };
  }
}
