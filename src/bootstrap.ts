import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { LogController } from 'fastify';
import type { Logger } from 'pino';
import { AppModule } from './app.module';
import type { BrokerConfig } from './config/config.schema';
import { lazyChildLogger } from './logging/lazy-request-logger';
import { PinoNestLogger } from './logging/logger';

/** Request ids: the caller's `X-Request-Id` when it looks sane, else a fresh one. */
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * Builds the Nest application on Fastify, without listening. Shared by `main.ts`, the sandbox
 * and the tests, so all of them run exactly the production wiring.
 */
export async function createBrokerApp(
  config: BrokerConfig,
  logger: Logger,
): Promise<NestFastifyApplication> {
  const adapter = new FastifyAdapter({
    loggerInstance: logger,
    // Per-request info logs would cost more than the whole GET /token hot path; audit lines
    // are written by the features themselves.
    logController: new LogController({ disableRequestLogging: true }),
    childLoggerFactory: lazyChildLogger,
    genReqId: (req: { headers: Record<string, string | string[] | undefined> }) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && REQUEST_ID.test(given) ? given : crypto.randomUUID();
    },
    routerOptions: { maxParamLength: 200 },
    // Bounds the query string too: an oversized request line is refused before any parsing.
    http: { maxHeaderSize: 16_384 },
    return503OnClosing: true,
    forceCloseConnections: 'idle',
  });
  const app = await NestFactory.create<NestFastifyApplication>(
    AppModule.forRoot(config, logger),
    adapter,
    { logger: new PinoNestLogger(logger), bufferLogs: false },
  );
  const fastify = app.getHttpAdapter().getInstance();
  fastify.addHook('onSend', (req, reply, payload, done) => {
    reply.header('x-request-id', req.id);
    reply.header('x-content-type-options', 'nosniff');
    // JSON APIs are never framed, never run scripts and never need a referrer.
    reply.header('x-frame-options', 'DENY');
    reply.header('content-security-policy', "default-src 'none'; frame-ancestors 'none'");
    reply.header('referrer-policy', 'no-referrer');
    done(null, payload);
  });
  return app;
}
