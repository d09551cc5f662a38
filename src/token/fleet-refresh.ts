import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { MetricsService, RefreshResult } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { CredentialsCache } from '../secrets/credentials-cache';
import { isFleetWide } from './refresh-failure';
import { MIN_SERVE_MS } from './refresh-schedule';
import { fetchFromProvider } from './provider-fetch';
import type { TokenRecord } from './token-record';
import type { FleetBus, RefreshLock, TokenRecords } from './token-store';
import { TokenStoreException } from './token-store.exception';
import { TokenErrorCode, TokenException } from './token.exception';

/**
 * A forced refresh takes a token requested up to this long before it was asked for as the
 * fresh one: operators (or a script on every replica) asking together must cost one provider
 * request, not one each, although their requests reach the replicas some milliseconds apart.
 */
export const FORCED_COALESCE_MS = 100;

/** Collaborators of one client's {@link FleetRefresh}. */
export interface FleetRefreshDeps {
  store: TokenRecords & RefreshLock & Pick<FleetBus, 'generation'>;
  grantor: TokenGrantor;
  credentials: CredentialsCache;
  metrics: Pick<MetricsService, 'lockAttempts' | 'cacheLookups' | 'refreshes' | 'providerLatency'>;
  logger: Logger;
  /**
   * How long the shared store must keep failing before this replica refreshes on its own
   * (a couple of Redis command timeouts): one late reply is not an outage.
   */
  storeGraceMs: number;
  /** The refresh floor (`TOKEN_MIN_REFRESH_INTERVAL_MS`): at most one grant per interval. */
  minRefreshIntervalMs: number;
  now: () => number;
}

/** What the state machine knows that the pass needs, read afresh after every await. */
export interface RefreshContext {
  /** The token this replica serves now (L1), if any. */
  held(): TokenRecord | undefined;
  /** Whether `record` ends the refresh: outside its refresh window and enough for every waiter. */
  goodEnough(record: TokenRecord): boolean;
  /**
   * Records a failed provider request (counts, logs, answers waiters a permanent failure) and
   * returns how long this replica would back off; the pass then shares that delay with the
   * fleet before releasing the lock (for the provider's trouble, see {@link isFleetWide}) and
   * answers `failed`. Without it the failure is thrown,
   * and nothing is shared.
   */
  failed?(err: unknown): number;
}

/** Outcome of one pass. */
export type RefreshPass =
  | {
      kind: 'token';
      record: TokenRecord;
      /** Asked from the provider by this pass (not adopted). */
      fetched: boolean;
      /** Not written to the shared store (it was down): push it once the store is back. */
      unshared: boolean;
    }
  /** Another replica holds the lock, or the store failed within its grace: wait, then retry. */
  | { kind: 'wait' }
  /**
   * No provider request now: the fleet is backing off (`deferred`: set by a replica's failure
   * or the provider's Retry-After), or this pass's request failed (`failed`, already recorded
   * through {@link RefreshContext.failed}). `retryInMs`: when the fleet's next attempt is due.
   */
  | { kind: 'deferred' | 'failed'; retryInMs: number }
  /**
   * No provider request now: a token was granted less than the refresh floor ago (fleet-wide
   * through the store, or by this replica while the store is down). `retryInMs`: when the
   * floor ends.
   */
  | {
      kind: 'floor';
      retryInMs: number;
      /** Lifetime of the grant that started the floor (another replica's, perhaps unusable). */
      lifetimeMs?: number;
    }
  /**
   * The provider granted a token too short-lived to serve (less than the minimum left when it
   * arrived): neither stored nor served. The floor started with it. `lifetimeMs`: its lifetime.
   */
  | { kind: 'unusable'; lifetimeMs: number; retryInMs: number };

/**
 * The fleet refresh pass of one client: read the shared store, take the fleet lock, read again
 * inside it, ask the provider, fenced write. **The one place the refresh lock is taken.**
 *
 * If the store is down for longer than `storeGraceMs` (or the token served is about to run
 * out), the pass asks the provider directly: this replica's loop is then the single flight.
 */
export class FleetRefresh {
  /** When the current run of store failures began (undefined while the store answers). */
  private storeFailingSince?: number;
  /**
   * When this replica last obtained a token from the provider: its own refresh floor while
   * the store (which holds the fleet's) is unreachable.
   */
  private lastGrantAt?: number;

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: FleetRefreshDeps,
  ) {}

  /** One pass: L2, lock, L2 again, provider, fenced write. */
  async run(ctx: RefreshContext): Promise<RefreshPass> {
    const { store, metrics } = this.deps;
    const id = this.client.id;
    try {
      const held = ctx.held();
      if (held && ctx.goodEnough(held)) return token(held, false);
      const found = await this.readShared();
      this.storeFailingSince = undefined;
      if (found && ctx.goodEnough(found)) {
        this.countRefresh('adopted');
        return token(found, false);
      }
      const locked = await store.withRefreshLock(id, () => {
        metrics.lockAttempts.labels(id, 'acquired').inc();
        return this.underLock(ctx);
      });
      if (locked.acquired) return locked.value;
      metrics.lockAttempts.labels(id, 'held_elsewhere').inc();
      return { kind: 'wait' };
    } catch (err) {
      if (!(err instanceof TokenStoreException)) throw err;
      noteStoreFailure(this.deps.logger, id, err);
      metrics.lockAttempts.labels(id, 'error').inc();
      // One slow or failed command is not an outage: under CPU pressure a reply can miss the
      // command timeout while Redis is fine. Fetching at once would make this replica refresh
      // beside the fleet's lock holder, so retry through the store until it has failed for
      // `storeGraceMs`, or the token we serve is about to run out.
      const now = this.deps.now();
      this.storeFailingSince ??= now;
      const withinGrace = now - this.storeFailingSince < this.deps.storeGraceMs;
      const held = ctx.held();
      const tokenLasts = held === undefined || held.expiresAt - now > 2 * this.deps.storeGraceMs;
      if (withinGrace && tokenLasts) return { kind: 'wait' };
      // Degraded: this replica refreshes on its own; the loop is the per-replica single flight,
      // held to the floor by its own clock.
      const localHoldMs = this.localHoldMs();
      if (localHoldMs > 0) return { kind: 'floor', retryInMs: localHoldMs };
      const record = await this.fetch();
      this.lastGrantAt = this.deps.now();
      return this.servable(record) ? token(record, true, true) : this.unusable(record);
    }
  }

  /** Inside the lock: L2 again, the fleet's backoff and floor, provider, fenced write. */
  private async underLock(ctx: RefreshContext): Promise<RefreshPass> {
    // Inside the lock, re-read: the previous holder may have written just now.
    const again = await this.readShared();
    if (again && ctx.goodEnough(again)) {
      this.countRefresh('adopted');
      return token(again, false);
    }
    const heldNow = ctx.held();
    if (heldNow && ctx.goodEnough(heldNow)) return token(heldNow, false);
    // The fleet backs off as one: after a 429 or a failure, the next request waits for the
    // shared deferral however many replicas want a token.
    const deferredMs = await this.deps.store.refreshDeferral(this.client.id);
    if (deferredMs > 0) return { kind: 'deferred', retryInMs: deferredMs };
    // The floor: whatever the lifetime or the callers' min_ttl, one grant per interval.
    const hold = await this.deps.store.refreshHold(this.client.id);
    if (hold.ms > 0) return { kind: 'floor', retryInMs: hold.ms, lifetimeMs: hold.lifetimeMs };
    let record: TokenRecord;
    try {
      record = await this.fetch();
    } catch (err) {
      if (!ctx.failed) throw err;
      const delayMs = ctx.failed(err);
      // Shared before the lock is released, so the next holder already sees it.
      const retryInMs = isFleetWide(err) ? await this.deferFleet(delayMs) : delayMs;
      return { kind: 'failed', retryInMs };
    }
    // Started before the lock is released, so the next holder already sees it.
    await this.holdFleet(record);
    if (!this.servable(record)) return this.unusable(record);
    const shared = await this.publish(record);
    return token(record, true, !shared);
  }

  /** Lifts this replica's own floor: the provider rejected the token, a new one is needed now. */
  liftLocalFloor(): void {
    this.lastGrantAt = undefined;
  }

  /** Ms left of this replica's own floor (the one it keeps while the store is down). */
  private localHoldMs(): number {
    if (this.lastGrantAt === undefined) return 0;
    return Math.max(0, this.lastGrantAt + this.deps.minRefreshIntervalMs - this.deps.now());
  }

  /** Starts the floor, fleet-wide and here (the store may be down by the next pass). */
  private async holdFleet(record: TokenRecord): Promise<void> {
    this.lastGrantAt = this.deps.now();
    try {
      await this.deps.store.holdRefreshes(
        this.client.id,
        this.deps.minRefreshIntervalMs,
        record.expiresAt - record.obtainedAt,
      );
    } catch (err) {
      noteStoreFailure(this.deps.logger, this.client.id, err);
    }
  }

  /** Whether `record` still has the minimum left to be served, now that it has arrived. */
  private servable(record: TokenRecord): boolean {
    return record.expiresAt - this.deps.now() >= MIN_SERVE_MS;
  }

  private unusable(record: TokenRecord): RefreshPass {
    return {
      kind: 'unusable',
      lifetimeMs: record.expiresAt - record.obtainedAt,
      retryInMs: Math.max(1, this.localHoldMs()),
    };
  }

  /**
   * The shared token, or undefined when there is none or it is unreadable (a corrupt value is
   * discarded so a fresh token can be written). Throws {@link TokenStoreException}.
   */
  async readShared(): Promise<TokenRecord | undefined> {
    const { store, metrics, logger } = this.deps;
    const stored = await store.read(this.client.id);
    if (stored.status === 'corrupt') {
      logger.warn(
        { client: this.client.id },
        'shared token value is unreadable (wrong key, tampered or foreign); discarding it and refreshing',
      );
      await store.discardCorrupt(this.client.id);
      return undefined;
    }
    metrics.cacheLookups
      .labels(this.client.id, 'l2', stored.status === 'found' ? 'hit' : 'miss')
      .inc();
    return stored.status === 'found' ? stored.record : undefined;
  }

  /**
   * Writes the new token to L2; if a newer one is already there, the fence keeps it and the
   * next read adopts it. Returns whether the store answered (false: push it on recovery).
   */
  private async publish(record: TokenRecord): Promise<boolean> {
    try {
      const written = await this.deps.store.writeFenced(this.client.id, record);
      if (!written) {
        this.deps.logger.info(
          { client: this.client.id },
          'a newer token was already stored; the fence kept it',
        );
      }
      return true;
    } catch (err) {
      noteStoreFailure(this.deps.logger, this.client.id, err);
      return false;
    }
  }

  /**
   * Defers the fleet's next provider request by `delayMs` (never shortening a longer deferral
   * already set) and returns when the fleet's next attempt is due. Without the store, this
   * replica's own delay.
   */
  private async deferFleet(delayMs: number): Promise<number> {
    try {
      return Math.max(delayMs, await this.deps.store.deferRefresh(this.client.id, delayMs));
    } catch (err) {
      noteStoreFailure(this.deps.logger, this.client.id, err);
      return delayMs;
    }
  }

  /**
   * The operator's forced refresh: one provider request for the whole fleet, under the refresh
   * lock (waited for, up to `waitMs`), written with the fence, which notifies every replica.
   * Ignores the fleet's floor and backoff (an operator asked), but starts the floor after.
   *
   * Coalesced: a token the store got after `askedAt` (less {@link FORCED_COALESCE_MS}) is the
   * fresh token asked for, so N operators or replicas asking at once cost one request. Throws
   * {@link TokenStoreException} when the store is down (no fleet-wide refresh without it), a
   * provider exception when the provider refuses.
   */
  async forced(askedAt: number, waitMs: number): Promise<Forced> {
    const { store, metrics } = this.deps;
    const id = this.client.id;
    const deadline = this.deps.now() + waitMs;
    for (;;) {
      const locked = await store.withRefreshLock(id, () => {
        metrics.lockAttempts.labels(id, 'acquired').inc();
        return this.forcedUnderLock(askedAt);
      });
      if (locked.acquired) return locked.value;
      metrics.lockAttempts.labels(id, 'held_elsewhere').inc();
      if (this.deps.now() >= deadline) return this.lockBusy();
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Inside the lock: adopt a token obtained since `askedAt`, or ask the provider for one. */
  private async forcedUnderLock(askedAt: number): Promise<Forced> {
    const found = await this.readShared();
    if (found && found.obtainedAt >= askedAt - FORCED_COALESCE_MS) {
      this.countRefresh('adopted');
      return { record: found, fetched: false, written: false };
    }
    const record = await this.fetch();
    await this.holdFleet(record);
    const written = await this.deps.store.writeFenced(this.client.id, record);
    return { record, fetched: true, written };
  }

  /** Re-reads the credentials now; whether they changed (never what they are). */
  async reloadCredentials(): Promise<'changed' | 'unchanged' | 'first'> {
    return this.deps.credentials.reload();
  }

  private lockBusy(): never {
    throw new TokenException(
      TokenErrorCode.Unavailable,
      `client "${this.client.id}": another replica held the refresh lock for the whole wait; retry the forced refresh in a few seconds`,
      { retryAfterSeconds: 2 },
    );
  }

  /** Asks the provider (see {@link fetchFromProvider}). */
  private fetch(): Promise<TokenRecord> {
    return fetchFromProvider(this.client, this.deps);
  }

  private countRefresh(result: RefreshResult): void {
    this.deps.metrics.refreshes.labels(this.client.id, result).inc();
  }
}

/** A forced refresh's token: asked for by this replica (`fetched`), stored (`written`). */
type Forced = { record: TokenRecord; fetched: boolean; written: boolean };

function token(record: TokenRecord, fetched: boolean, unshared = false): RefreshPass {
  return { kind: 'token', record, fetched, unshared };
}

/**
 * Logs a shared-store failure at debug level (the store logs its own up/down transitions; one
 * line per failed command flooded the logs). Rethrows anything that is not a store failure.
 */
export function noteStoreFailure(logger: Logger, clientId: string, err: unknown): void {
  if (!(err instanceof TokenStoreException)) throw err;
  logger.debug({ client: clientId, err: err.message }, 'shared store unavailable');
}
