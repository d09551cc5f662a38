import type { Logger } from 'pino';
import type { MetricsService } from '../metrics/metrics.service';
import type { StoreHealth } from './token-store';
import { TokenStoreException } from './token-store.exception';

/**
 * Watches whether the shared store (Redis) lost its data: restarted empty, flushed, or failed
 * over to a node that missed writes. Tokens heal by themselves after that (the next refresh
 * writes a new one); idempotency records do not: an order answered before the loss would be
 * sent again on a repeat, and could be created twice. Nothing can undo that, so the watch makes
 * it loud: `token_broker_redis_data_loss_total`, an error log, and the chart's alert.
 *
 * Plain TypeScript (no Nest import), driven by {@link TokenService}: every `intervalMs` and
 * whenever the store comes back after an outage.
 */
export class StoreContinuityWatch {
  private timer?: NodeJS.Timeout;
  private checking?: Promise<void>;

  constructor(
    private readonly store: Pick<StoreHealth, 'kind' | 'checkContinuity'>,
    private readonly clientIds: readonly string[],
    private readonly metrics: Pick<MetricsService, 'redisDataLoss'>,
    private readonly logger: Logger,
    private readonly intervalMs: number,
  ) {}

  /** Starts checking; a memory store has nothing to lose and is not watched. */
  start(): void {
    if (this.store.kind !== 'redis' || this.timer) return;
    void this.check();
    this.timer = setInterval(() => void this.check(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One round over every client; a round already running is joined, not repeated. */
  check(): Promise<void> {
    if (this.store.kind !== 'redis') return Promise.resolve();
    this.checking ??= this.round().finally(() => (this.checking = undefined));
    return this.checking;
  }

  private async round(): Promise<void> {
    for (const client of this.clientIds) {
      let found;
      try {
        found = await this.store.checkContinuity(client);
      } catch (err) {
        // An outage is reported by the store's health; the next round after it compares.
        if (err instanceof TokenStoreException) return;
        throw err;
      }
      if (found !== 'lost' && found !== 'rolled_back') continue;
      this.metrics.redisDataLoss.labels(client, found).inc();
      this.logger.error(
        { client, continuity: found },
        found === 'lost'
          ? 'Redis lost its data: the continuity marker this replica saw is gone (Redis restarted without persistence, was flushed, or failed over to a node that never had the data). Idempotency records went with it: a repeat of an order answered before now is sent to the provider again and may create a second order. Tokens recover by themselves. Give Redis persistence (appendonly yes, appendfsync everysec) and a replica with automatic failover; see docs/redis.md, "What idempotency needs from Redis"'
          : 'Redis went back in time: the continuity marker is older than one this replica already saw (a failover to a replica that missed the latest writes). Idempotency records written just before it may be gone: a repeat of such an order may be sent again. See docs/redis.md, "What idempotency needs from Redis"',
      );
    }
  }
}
