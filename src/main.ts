import { loadConfig } from './config/config.loader';
import { ConfigException } from './config/config.exception';
import { redisConfigured } from './config/config.schema';
import { createBrokerApp } from './bootstrap';
import { createLogger } from './logging/logger';

/**
 * Bootstraps the broker: config, logger, app, listen, and graceful shutdown: on SIGTERM the
 * listener stops taking requests (new ones get 503), in-flight ones finish, the refresh lock
 * is released, and the process exits 0 within the grace period.
 */
async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig(process.env);
  } catch (err) {
    if (err instanceof ConfigException) {
      process.stderr.write(`${err.message}\n`);
      process.exit(78); // EX_CONFIG
    }
    throw err;
  }
  const logger = createLogger(config.log.level);
  startupLogger = logger;
  const app = await createBrokerApp(config, logger);
  await app.listen({ port: config.http.port, host: config.http.host });
  logger.info(
    {
      port: config.http.port,
      clients: config.clients.map((c) => c.id),
      store: redisConfigured(config.redis) ? `redis (${config.redis.mode})` : 'memory',
    },
    'token broker listening',
  );

  const shutdown = (signal: NodeJS.Signals): void => {
    logger.info({ signal, graceMs: config.http.shutdownGraceMs }, 'shutting down');
    setTimeout(() => {
      logger.error('shutdown grace period exceeded; exiting');
      process.exit(1);
    }, config.http.shutdownGraceMs).unref();
    app.close().then(
      () => {
        logger.info('stopped');
        logger.flush(() => process.exit(0));
      },
      (err: unknown) => {
        logger.error({ err }, 'error during shutdown');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', shutdown);
  process.once('SIGINT', shutdown);
}

/** The logger once the configuration is read: a start-up failure after that is a JSON line. */
let startupLogger: ReturnType<typeof createLogger> | undefined;

main().catch((err: unknown) => {
  const message = `token broker failed to start: ${err instanceof Error ? err.message : String(err)}`;
  if (startupLogger === undefined) {
    process.stderr.write(`${message}\n`);
    process.exit(1);
  }
  startupLogger.fatal(message);
  startupLogger.flush(() => process.exit(1));
});
