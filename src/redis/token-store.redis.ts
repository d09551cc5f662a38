import type { Logger } from 'pino';
import type { RedisSettings } from '../config/config.schema';
import type { TokenCipher } from '../token/token-cipher';
import type { TokenRecord } from '../token/token-record';
import type {
  Locked,
  TokenStore,
  TokenStoreEvent,
  LockState,
  RefreshHold,
  Revocation,
  StoredToken,
} from '../token/token-store';
import { RedisFleetBus } from './fleet-bus.redis';
import type { RedisClient } from './redis.connection';
import { redisKeys } from './redis.constants';
import type { StateLogger } from './redis-state';
import { RedisRefreshLock } from './refresh-lock.redis';
import { RedisStoreHealth } from './store-health.redis';
import { RedisTokenRecords } from './token-records.redis';

/**
 * The store's health owns the connections; one part per other port, wired to them. No replica's
 * wall clock decides anything here: replicas send durations, and every absolute time is Redis's
 * (`TIME` in the scripts).
 */
export class RedisTokenStore extends RedisStoreHealth implements TokenStore {
  private readonly records: RedisTokenRecords;
  private readonly lock: RedisRefreshLock;
  private readonly bus: RedisFleetBus;

  constructor(
    redis: RedisClient,
    subscriber: RedisClient,
    cipher: TokenCipher,
    settings: RedisSettings,
    lockTtlMs: number,
    clientIds: readonly string[],
    logger?: StateLogger | Logger,
  ) {
    super(redis, subscriber, settings, clientIds[0] ?? 'probe', logger);
    this.bus = new RedisFleetBus(this);
    this.records = new RedisTokenRecords(this, this.bus, cipher);
    this.lock = new RedisRefreshLock(this, lockTtlMs, settings.commandTimeoutMs);

    const channels = new Map(clientIds.map((id) => [redisKeys.events(id), id]));
    subscriber.on('message', (channel: string, message: string) => {
      if (channel === redisKeys.reloadChannel) return this.bus.reloadRequested(message);
      const clientId = channels.get(channel);
      if (clientId !== undefined) this.records.deliver(clientId, message);
    });
    void subscriber.subscribe(...channels.keys(), redisKeys.reloadChannel).catch(() => undefined);
  }

  read(clientId: string): Promise<StoredToken> {
    return this.records.read(clientId);
  }

  writeFenced(clientId: string, record: TokenRecord): Promise<boolean> {
    return this.records.writeFenced(clientId, record);
  }

  invalidate(clientId: string, fingerprint: string): Promise<boolean> {
    return this.records.invalidate(clientId, fingerprint);
  }

  discardCorrupt(clientId: string): Promise<void> {
    return this.records.discardCorrupt(clientId);
  }

  onEvent(listener: (event: TokenStoreEvent) => void): void {
    this.records.onEvent(listener);
  }

  withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>> {
    return this.lock.withRefreshLock(clientId, fn);
  }

  lockState(clientId: string): Promise<LockState> {
    return this.lock.lockState(clientId);
  }

  deferRefresh(clientId: string, delayMs: number): Promise<number> {
    return this.lock.deferRefresh(clientId, delayMs);
  }

  refreshDeferral(clientId: string): Promise<number> {
    return this.lock.refreshDeferral(clientId);
  }

  holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void> {
    return this.lock.holdRefreshes(clientId, intervalMs, lifetimeMs);
  }

  refreshHold(clientId: string): Promise<RefreshHold> {
    return this.lock.refreshHold(clientId);
  }

  revoke(clientId: string): Promise<Revocation> {
    return this.bus.revoke(clientId);
  }

  generation(clientId: string): number {
    return this.bus.generation(clientId);
  }

  acknowledgeRevocation(clientId: string, generation: number): Promise<void> {
    return this.bus.acknowledgeRevocation(clientId, generation);
  }

  revocationAcks(clientId: string, generation: number): Promise<number> {
    return this.bus.revocationAcks(clientId, generation);
  }

  requestReload(): Promise<number> {
    return this.bus.requestReload();
  }

  onReloadRequested(listener: (from: string) => void): void {
    this.bus.onReloadRequested(listener);
  }
}
