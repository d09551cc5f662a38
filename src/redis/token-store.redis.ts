import { setTimeout as sleep } from 'node:timers/promises';
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

/** As `retryDelayOnFailover`. */
const RESUBSCRIBE_DELAY_MS = 100;
const RESYNC_INTERVAL_MS = 1000;

/**
 * The store's health owns the connections; one part per other port, wired to them. No replica's
 * wall clock decides anything here: replicas send durations, and every absolute time is Redis's
 * (`TIME` in the scripts).
 */
export class RedisTokenStore extends RedisStoreHealth implements TokenStore {
  private readonly records: RedisTokenRecords;
  private readonly lock: RedisRefreshLock;
  private readonly bus: RedisFleetBus;
  /** Settles once Redis confirmed the subscription, or refused it. */
  private readonly subscribed: Promise<unknown>;
  private readonly channels: string[];
  private resubscribing = false;
  private nodeLeft = false;

  constructor(
    redis: RedisClient,
    subscriber: RedisClient,
    cipher: TokenCipher,
    settings: RedisSettings,
    lockTtlMs: number,
    clientIds: readonly string[],
    logger?: StateLogger,
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
    this.channels = [...channels.keys(), redisKeys.reloadChannel];
    this.subscribed = subscriber.subscribe(...this.channels).catch(() => undefined);
    // A Cluster moves its subscriber off a dead or departed node without telling either client:
    // a node leaving is the only sign. Watched once subscribed, as nodes also leave at start-up.
    void this.subscribed.then(() => {
      for (const client of [redis, subscriber]) {
        client.on('-node', () => void this.resubscribe(subscriber));
      }
    });
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

  /**
   * Re-reads once the subscription is confirmed again, so that the re-read and the subscription
   * leave nothing between them; then at most once per {@link RESYNC_INTERVAL_MS} while nodes
   * keep leaving: a dead node that commands re-add to the pool leaves again at each one, until
   * the cluster fails it over.
   */
  private async resubscribe(subscriber: RedisClient): Promise<void> {
    this.nodeLeft = true;
    if (this.resubscribing) return;
    this.resubscribing = true;
    while (this.nodeLeft && !this.closing) {
      this.nodeLeft = false;
      // The client picks its new subscriber on the same event, a listener later; a SUBSCRIBE
      // still sent to the old one fails, and is tried again.
      await sleep(RESUBSCRIBE_DELAY_MS, undefined, { ref: false });
      const confirmed = await subscriber.subscribe(...this.channels).then(
        () => true,
        () => false,
      );
      if (!confirmed) {
        this.nodeLeft = true;
        continue;
      }
      this.recovered();
      await sleep(RESYNC_INTERVAL_MS, undefined, { ref: false });
    }
    this.resubscribing = false;
  }

  /**
   * Also waits, within `timeoutMs`, for the subscription: the token managers read the store once
   * this returns, and an event published after that read must reach this replica. A Cluster
   * client may resend its SUBSCRIBE after it is ready, when it moves off a seed node.
   */
  override async waitUntilReady(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    if (!(await super.waitUntilReady(timeoutMs))) return false;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.subscribed,
      new Promise((resolve) => (timer = setTimeout(resolve, deadline - Date.now()))),
    ]);
    clearTimeout(timer);
    return true;
  }
}
