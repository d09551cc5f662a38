import { type DynamicModule, Global, Module } from '@nestjs/common';
import type { Logger } from 'pino';
import { LOGGER } from './logger';

/** The same instance Fastify logs requests with. */
@Global()
@Module({})
export class LoggingModule {
  static forRoot(logger: Logger): DynamicModule {
    return {
      module: LoggingModule,
      providers: [{ provide: LOGGER, useValue: logger }],
      exports: [LOGGER],
    };
  }
}
