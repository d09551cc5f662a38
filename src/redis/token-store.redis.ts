import type { RedisSettings } from '../config/config.schema';
import type { TokenCipher } from '../token/token-cipher';
import type { TokenStore } from '../token/token-store';
import { RedisFleetBus } from './fleet-bus.redis';
import type { RedisClient } from './redis.connection';
import { redisKeys } from './redis.constants';
import type { StateLogger } from './redis-state';
import { RedisRefreshLock } from './refresh-lock.redis';
import { RedisStoreHealth } from './store-health.redis';
import { RedisTokenRecords } from './token-records.redis';

/**
 * The health part owns the connections; the other parts are wired to it. No replica's wall clock
 * decides anything here: replicas send durations, and every absolute time is Redis's (`TIME` in
 * the scripts).
 */
export class RedisTokenStore implements TokenStore {
  readonly health: RedisStoreHealth;
  readonly bus: RedisFleetBus;
  readonly records: RedisTokenRecords;
  readonly lock: RedisRefreshLock;

  constructor(
    redis: RedisClient,
    subscriber: RedisClient,
    cipher: TokenCipher,
    settings: RedisSettings,
    lockTtlMs: number,
    clientIds: readonly string[],
    logger?: StateLogger,
  ) {
    const channels = clientIds.map((id) => redisKeys.events(id));
    this.health = new RedisStoreHealth(
      redis,
      subscriber,
      settings,
      clientIds[0] ?? 'probe',
      [...channels, redisKeys.reloadChannel],
      logger,
    );
    this.bus = new RedisFleetBus(this.health);
    this.records = new RedisTokenRecords(this.health, this.bus, cipher, clientIds);
    this.lock = new RedisRefreshLock(this.health, lockTtlMs, settings.commandTimeoutMs);
    subscriber.on('message', (channel: string, message: string) => {
      if (channel === redisKeys.reloadChannel) return this.bus.reloadRequested(message);
      const clientId = this.records.clientOf(channel);
      if (clientId !== undefined) this.records.deliver(clientId, message);
    });
  }
}
