import { type DynamicModule, Global, Module } from '@nestjs/common';
import { BROKER_CONFIG } from './config.constants';
import type { BrokerConfig } from './config.schema';

/**
 * Provides the already-validated configuration. `main.ts` loads it before Nest starts so a bad
 * setting stops the process with a clear message instead of a DI stack trace.
 */
@Global()
@Module({})
export class ConfigModule {
  static forRoot(config: BrokerConfig): DynamicModule {
    return {
      module: ConfigModule,
      providers: [{ provide: BROKER_CONFIG, useValue: config }],
      exports: [BROKER_CONFIG],
    };
  }
}
