import { Redis, type RedisOptions } from 'ioredis';
import type { RedisSettings } from '../config/config.schema';

/**
 * Options for every broker connection to Redis. The point is that nothing waits on a dead
 * Redis: commands fail after `commandTimeoutMs` (a blackholed link) and fail at once while
 * disconnected (no offline queue), so callers fall back to memory instead of queueing.
 */
export function redisOptions(
  settings: RedisSettings,
  role: 'command' | 'subscriber',
): RedisOptions {
  return {
    connectTimeout: settings.connectTimeoutMs,
    commandTimeout: role === 'command' ? settings.commandTimeoutMs : undefined,
    // The subscriber queues its SUBSCRIBE until connected; command traffic must never queue.
    enableOfflineQueue: role === 'subscriber',
    maxRetriesPerRequest: role === 'command' ? 0 : null,
    // Reconnect forever with a short cap: an outage should end the moment Redis is back.
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 6), 2000),
    keepAlive: 5000,
    connectionName: `token-broker-${role}`,
    lazyConnect: false,
  };
}

export function createRedisConnection(
  settings: RedisSettings,
  role: 'command' | 'subscriber',
): Redis {
  // `url` is validated to be present by the caller; ioredis parses rediss:// as TLS itself.
  return new Redis(settings.url!, redisOptions(settings, role));
}
