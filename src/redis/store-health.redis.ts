import { randomUUID } from 'node:crypto';
import type { RedisSettings } from '../config/config.schema';
import type { StoreContinuity, StoreHealth, StoreTopology } from '../token/token-store';
import { TokenStoreErrorCode, TokenStoreException } from '../token/token-store.exception';
import { RedisClockOffset } from './redis-clock';
import { closeRedisClient, type RedisClient, takeEarlyError } from './redis.connection';
import { redisKeys } from './redis.constants';
import { RedisStateTracker, type StateLogger } from './redis-state';
import { defineTokenStoreScripts, type RedisWithScripts } from './token-store.lua';

const SILENT: StateLogger = {
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
};

/** The store's other parts send every command through {@link run}, so each outcome counts. */
export class RedisStoreHealth implements StoreHealth {
  readonly kind = 'redis' as const;
  readonly redis: RedisWithScripts;
  /** Only durations taken on it reach Redis, so an offset cancels out; tests replace it. */
  now: () => number = Date.now;
  readonly clock = new RedisClockOffset();
  private readonly recoveredListeners: Array<() => void> = [];
  private readonly epochs = new Map<string, { id: string; seq: number }>();
  private readonly tracker: RedisStateTracker;
  private readonly pingTimer: NodeJS.Timeout;
  protected closing = false;

  /** @param probeClient whose keys the health probe touches (an ACL grants per client). */
  constructor(
    redis: RedisClient,
    private readonly subscriber: RedisClient,
    private readonly settings: RedisSettings,
    private readonly probeClient: string,
    logger: StateLogger = SILENT,
  ) {
    this.tracker = new RedisStateTracker(logger, describeRedis(settings));
    this.redis = defineTokenStoreScripts(redis);
    // Connection errors carry the real cause that failing commands lack; an unhandled 'error'
    // event would also crash the process.
    const onConnectionError = (err: unknown) => this.tracker.failed(err, true);
    for (const client of [redis, subscriber]) {
      client.on('error', onConnectionError);
      client.on('node error', onConnectionError);
      const early = takeEarlyError(client);
      if (early !== undefined) onConnectionError(early);
    }
    // Every reconnection is a recovery, even a blip shorter than the ping interval: Redis may
    // have restarted empty and the replicas must push their token back. READONLY closes it too.
    redis.on('close', () => {
      if (!this.closing) this.tracker.failed(new Error('connection to Redis closed'));
    });
    redis.on('ready', () => void this.ping());
    // A resubscribed subscriber missed what was published meanwhile: re-read, as after an outage.
    let subscribedBefore = false;
    subscriber.on('ready', () => {
      if (subscribedBefore) this.recovered();
      subscribedBefore = true;
    });
    this.pingTimer = setInterval(() => void this.ping(), settings.pingIntervalMs);
    this.pingTimer.unref();
  }

  get healthy(): boolean {
    return this.tracker.state === 'up';
  }

  /** A setting to fix (authentication, ACL, TLS trust), not an outage to wait out. */
  get configurationError(): string | undefined {
    return this.tracker.problem?.message;
  }

  onRecovered(listener: () => void): void {
    this.recoveredListeners.push(listener);
  }

  topology(): StoreTopology {
    return { kind: 'redis', ...describeTopology(this.settings), state: this.tracker.state };
  }

  async checkContinuity(clientId: string): Promise<StoreContinuity> {
    const sentAt = this.now();
    const [id, seq, redisNow] = await this.run((redis) =>
      redis.tbEpochAdvance(redisKeys.epoch(clientId), randomUUID()),
    );
    this.clock.observe(sentAt, this.now(), Number(redisNow));
    const seen = this.epochs.get(clientId);
    this.epochs.set(clientId, { id, seq: Number(seq) });
    if (seen === undefined) return 'first';
    if (seen.id !== id) return 'lost';
    return Number(seq) > seen.seq ? 'kept' : 'rolled_back';
  }

  async waitUntilReady(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      await this.ping();
      if (this.healthy) return true;
      // A configuration error will not pass within the wait: start now, not ready.
      if (this.tracker.state === 'misconfigured') return false;
      await new Promise((r) => setTimeout(r, 50));
    }
    return this.healthy;
  }

  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.pingTimer);
    await Promise.all([closeRedisClient(this.subscriber), closeRedisClient(this.redis)]);
  }

  private async ping(): Promise<void> {
    try {
      await this.run(
        (redis) =>
          redis.tbProbe(
            redisKeys.token(this.probeClient),
            `tb:{${this.probeClient}}:probe-never-exists`,
            `tb:{${this.probeClient}}:probe`,
          ),
        true,
      );
    } catch {
      // `run` already marked the store unhealthy.
    }
  }

  /** `probe`: the only success that clears an ACL problem (a read says nothing about scripts). */
  async run<T>(command: (redis: RedisWithScripts) => Promise<T>, probe = false): Promise<T> {
    try {
      const result = await command(this.redis);
      this.markHealthy(probe);
      return result;
    } catch (cause) {
      throw this.unavailable(cause, 'a Redis command');
    }
  }

  /** A success that did not go through {@link run} (the lock's acquisition, say). */
  markHealthy(probe = false): void {
    if (this.tracker.succeeded(probe)) this.recovered();
  }

  /** What this replica heard or wrote may be stale: every listener re-reads. */
  protected recovered(): void {
    for (const l of this.recoveredListeners) l();
  }

  unavailable(cause: unknown, what: string): TokenStoreException {
    this.tracker.failed(cause);
    const problem = this.tracker.problem;
    const reason = cause instanceof Error ? cause.message : 'unknown error';
    return new TokenStoreException(
      TokenStoreErrorCode.Unavailable,
      problem
        ? `Redis failed during ${what}: ${problem.message}`
        : `Redis failed during ${what} (${reason}); serving from memory until it returns. Check the Redis settings (REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES) and the Redis server; see "commandTimeoutMs" for how long a command may take`,
      { cause },
    );
  }
}

/** Host and port only, never a password. */
function describeTopology(settings: RedisSettings): { mode: string; nodes: string[] } {
  switch (settings.mode) {
    case 'standalone':
      return {
        mode: 'standalone',
        nodes: URL.canParse(settings.url ?? '') ? [new URL(settings.url!).host] : [],
      };
    case 'sentinel':
      return { mode: 'sentinel', nodes: [...(settings.sentinel.nodes ?? [])] };
    case 'cluster':
      return { mode: 'cluster', nodes: [...(settings.cluster.nodes ?? [])] };
  }
}

function describeRedis(settings: RedisSettings): string {
  switch (settings.mode) {
    case 'standalone':
      // Only scheme and host: the URL may carry a password.
      return URL.canParse(settings.url ?? '')
        ? `standalone ${new URL(settings.url!).protocol}//${new URL(settings.url!).host}`
        : 'standalone';
    case 'sentinel':
      return `sentinel ${settings.sentinel.masterName ?? ''} via ${(settings.sentinel.nodes ?? []).join(',')}`;
    case 'cluster':
      return `cluster via ${(settings.cluster.nodes ?? []).join(',')}`;
  }
}
