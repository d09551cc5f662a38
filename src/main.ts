import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { BrokerConfig } from './config/config.schema';
import { loadConfig } from './config/config.loader';
import { ConfigException } from './config/config.exception';
import { adminPortOf } from './config/http.schema';
import { redisConfigured } from './config/redis.schema';
import { createLogger } from './logging/logger';
import { startTracing } from './tracing/tracing';
// No imports of its own: loading it before tracing starts hooks nothing too early.
import { DrainState } from './health/drain-state';

/**
 * On SIGTERM the replica drains: readiness answers 503 and every answer closes its connection for
 * `SHUTDOWN_DRAIN_DELAY_MS`; then the listener stops, in-flight requests finish, the refresh lock
 * is released, and the process exits 0 within the grace period.
 */
async function main(): Promise<void> {
  const config = loadConfigOrExit();
  const logger = createLogger(config.log.level);
  startupLogger = logger;
  // Tracing first: its instrumentations hook ioredis, undici and the AWS SDK as they load.
  let stopTracing: Awaited<ReturnType<typeof startTracing>>;
  try {
    stopTracing = await startTracing(process.env);
  } catch (err) {
    logger.fatal({ err }, 'tracing is misconfigured');
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    logger.flush(() => process.exit(78));
    return;
  }
  if (stopTracing) logger.info('OpenTelemetry tracing on (OTEL_* variables)');
  const { createBrokerApp } = await import('./bootstrap');
  const app = await createBrokerApp(config, logger, process.env);
  await app.listen({ port: config.http.port, host: config.http.host });
  logListening(config, logger);
  const shutdown = shutdownHandler(app, config, logger, stopTracing);
  process.once('SIGTERM', shutdown);
  process.once('SIGINT', shutdown);
}

/** Invalid: exits 78 (EX_CONFIG) with the errors on stderr. */
function loadConfigOrExit(): BrokerConfig {
  try {
    return loadConfig(process.env);
  } catch (err) {
    if (!(err instanceof ConfigException)) throw err;
    process.stderr.write(`${err.message}\n`);
    process.exit(78); // EX_CONFIG
  }
}

/** A deprecated setting, then where the broker listens. */
function logListening(config: BrokerConfig, logger: Logger): void {
  if (config.http.metricsPort !== undefined && config.http.adminPort === undefined) {
    logger.warn(
      { metricsPort: config.http.metricsPort },
      'METRICS_PORT (http.metricsPort) is deprecated: it now opens the admin listener (/metrics, /health/*, /admin/*); rename it ADMIN_PORT (http.adminPort)',
    );
  }
  logger.info(
    {
      port: config.http.port,
      adminPort: adminPortOf(config.http),
      clients: config.clients.map((c) => c.id),
      store: redisConfigured(config.redis) ? `redis (${config.redis.mode})` : 'memory',
    },
    'token broker listening',
  );
}

/** Drain, close, flush the last spans, exit. */
function shutdownHandler(
  app: NestFastifyApplication,
  config: BrokerConfig,
  logger: Logger,
  stopTracing: Awaited<ReturnType<typeof startTracing>>,
): (signal: NodeJS.Signals) => void {
  const { shutdownDrainDelayMs: drainMs, shutdownGraceMs: graceMs } = config.http;
  return (signal: NodeJS.Signals): void => {
    app.get(DrainState).begin();
    logger.info({ signal, drainMs, graceMs }, 'shutting down');
    // The grace period starts when the listener stops, after the drain.
    setTimeout(() => {
      logger.error('shutdown grace period exceeded; exiting');
      process.exit(1);
    }, drainMs + graceMs).unref();
    (drainMs > 0 ? sleep(drainMs) : Promise.resolve())
      .then(() => app.close())
      .then(
        async () => {
          await stopTracing?.().catch((err: unknown) =>
            logger.warn({ err }, 'could not flush the last trace spans'),
          );
          logger.info('stopped');
          logger.flush(() => process.exit(0));
        },
        (err: unknown) => {
          logger.error({ err }, 'error during shutdown');
          process.exit(1);
        },
      );
  };
}

/** A start-up failure after the config is read is a JSON line. */
let startupLogger: Logger | undefined;

main().catch((err: unknown) => {
  const message = `token broker failed to start: ${err instanceof Error ? err.message : String(err)}`;
  if (startupLogger === undefined) {
    process.stderr.write(`${message}\n`);
    process.exit(1);
  }
  startupLogger.fatal(message);
  startupLogger.flush(() => process.exit(1));
});
