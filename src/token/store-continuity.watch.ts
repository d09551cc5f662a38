import type { Logger } from 'pino';
import type { MetricsService } from '../metrics/metrics.service';
import type { StoreHealth } from './token-store';
import { TokenStoreException } from './token-store.exception';

/**
 * Tokens heal after the store loses its data; idempotency records do not (a repeat of an answered
 * order could be created twice), so the watch makes it loud: a metric, an error log, an alert.
 */
export class StoreContinuityWatch {
  private timer?: NodeJS.Timeout;
  private checking?: Promise<void>;

  constructor(
    private readonly store: Pick<StoreHealth, 'kind' | 'checkContinuity'>,
    private clientIds: readonly string[],
    private readonly metrics: Pick<MetricsService, 'redisDataLoss'>,
    private readonly logger: Logger,
    private readonly intervalMs: number,
  ) {}

  /** The clients a reload left configured: the next round compares theirs. */
  follow(clientIds: readonly string[]): void {
    this.clientIds = clientIds;
  }

  /** A memory store has nothing to lose. */
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

  /** A round already running is joined, not repeated. */
  check(): Promise<void> {
    if (this.store.kind !== 'redis') return Promise.resolve();
    this.checking ??= this.round().finally(() => (this.checking = undefined));
    return this.checking;
  }

  /** One call for every client: the store decides how few commands that takes. */
  private async round(): Promise<void> {
    let found;
    try {
      found = await this.store.checkContinuity(this.clientIds);
    } catch (err) {
      // An outage is reported by the store's health; the next round after it compares.
      if (err instanceof TokenStoreException) return;
      throw err;
    }
    const lost = this.clientIds.filter((c) => found.get(c) === 'lost');
    const rolledBack = this.clientIds.filter((c) => found.get(c) === 'rolled_back');
    if (lost.length > 0) this.metrics.redisDataLoss.labels('lost').inc(lost.length);
    if (rolledBack.length > 0)
      this.metrics.redisDataLoss.labels('rolled_back').inc(rolledBack.length);
    // One line per kind and round, however many clients the node held.
    if (lost.length > 0) {
      this.logger.error(
        { clients: named(lost), continuity: 'lost' },
        'Redis lost its data: the continuity marker this replica saw is gone (Redis restarted without persistence, was flushed, or failed over to a node that never had the data). Idempotency records went with it: a repeat of an order answered before now is sent to the provider again and may create a second order. Tokens recover by themselves. Give Redis persistence (appendonly yes, appendfsync everysec) and a replica with automatic failover; see docs/redis.md, "What idempotency needs from Redis"',
      );
    }
    if (rolledBack.length > 0) {
      this.logger.error(
        { clients: named(rolledBack), continuity: 'rolled_back' },
        'Redis went back in time: the continuity marker is older than one this replica already saw (a failover to a replica that missed the latest writes). Idempotency records written just before it may be gone: a repeat of such an order may be sent again. See docs/redis.md, "What idempotency needs from Redis"',
      );
    }
  }
}

/** A log line names at most this many clients, and how many more. */
const NAMED_CLIENTS = 20;

function named(clients: readonly string[]): string[] {
  return clients.length <= NAMED_CLIENTS
    ? [...clients]
    : [...clients.slice(0, NAMED_CLIENTS), `... ${clients.length - NAMED_CLIENTS} more`];
}
