import { loadConfig } from './config/config.loader';
import { ConfigException } from './config/config.exception';
import { createBrokerApp } from './bootstrap';
import { createLogger } from './logging/logger';

/** Bootstraps the broker: config, logger, app, listen. SIGTERM is handled by Nest's hooks. */
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
  const app = await createBrokerApp(config, logger);
  await app.listen({ port: config.http.port, host: config.http.host });
  logger.info(
    {
      port: config.http.port,
      clients: config.clients.map((c) => c.id),
      store: config.redis.url ? 'redis' : 'memory',
    },
    'token broker listening',
  );
}

main().catch((err: unknown) => {
  process.stderr.write(
    `token broker failed to start: ${err instanceof Error ? err.message : String(err)}\n`,
  );
  process.exit(1);
});
