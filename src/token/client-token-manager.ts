import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { TokenSettings } from '../config/config.schema';
import type { HitCell, MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { ClientCredentials } from '../secrets/client-credentials';
import { CredentialsCache, SECRETS_MANAGER_ROTATION_STAGES } from '../secrets/credentials-cache';
import { FleetRefresh, noteStoreFailure } from './fleet-refresh';
import { HeldToken, type LastRefresh } from './held-token';
import { lifetimeTooShort } from './refresh-failure';
import { RefreshLoop } from './refresh-loop';
import { MIN_SERVE_MS } from './refresh-schedule';
import { RefreshStanding } from './refresh-standing';
import type { TokenRecord } from './token-record';
import type { TokenStore, TokenStoreEvent } from './token-store';
import { TokenWaiters } from './token-waiters';
import { TokenErrorCode, TokenException } from './token.exception';

export { MIN_SERVE_MS };

/** Collaborators of one client's manager; shared across clients. */
export interface ManagerDeps {
  store: TokenStore;
  grantor: TokenGrantor;
  /** Reads a client's credentials; `stage`: a Secrets Manager staging label instead of the current one. */
  loadCredentials: (client: ClientConfig, stage?: string) => Promise<ClientCredentials>;
  metrics: MetricsService;
  logger: Logger;
  settings: TokenSettings;
  /**
   * How long the shared store must keep failing before this replica refreshes on its own
   * (a couple of Redis command timeouts): one late reply is not an outage.
   */
  storeGraceMs: number;
  /** The clock (epoch ms); tests move it. @default Date.now */
  now?: () => number;
  /** Jitter source; tests seed it. @default Math.random */
  random?: () => number;
}

/** What the last refresh attempt left behind, for readiness and error messages. */
export interface ClientTokenStatus {
  client: string;
  hasToken: boolean;
  expiresAt?: number;
  refreshing: boolean;
  /** A failure that needs an operator (credentials refused or unreadable). */
  permanentError?: { code: TokenErrorCode; message: string };
  lastError?: string;
  /**
   * Set while the provider's tokens live too short for the broker to serve and refresh them
   * (see `neededLifetimeMs`): names the lifetime and the setting involved.
   */
  lifetimeError?: string;
  nextAttemptAt?: number;
  everObtained: boolean;
}

/**
 * One client's token lifecycle, as a state machine: L1 (a {@link HeldToken}), L2 (the shared
 * store), source (the provider).
 *
 * - Hot path: {@link peek} reads L1 synchronously; no I/O.
 * - Refresh: a single loop per process (the single flight, a {@link RefreshLoop}), started by
 *   the refresh-ahead timer, by a caller in the mandatory window, by an invalidation, or by a
 *   store event. Each pass is a {@link FleetRefresh} (L2, lock, L2 again, provider, fenced
 *   write); between passes the loop sleeps for the backoff {@link RefreshStanding} sets, or
 *   until a store event wakes it.
 * - Callers in the mandatory window wait in {@link TokenWaiters}, bounded by `waitTimeoutMs`.
 * - Failures: capped exponential backoff with full jitter; the current token keeps being
 *   served until it expires.
 */
export class ClientTokenManager {
  /** L1: the token this replica serves, and what it may hold. */
  private readonly held: HeldToken;
  /** The single flight: the refresh loop, its timer and its sleeps. */
  private readonly loop: RefreshLoop;
  private readonly waiters = new TokenWaiters();
  private readonly refresh: FleetRefresh;
  /** Failures, holds and the provider's lifetime: what a caller is told while it waits. */
  private readonly standing: RefreshStanding;
  /**
   * Set while {@link resync} runs: L1 is set aside until the generation is read, and callers
   * missing it wait for this (a few Redis round trips) rather than start a refresh of their own,
   * which could ask the provider for a token the set-aside one is about to cover.
   */
  private resyncing?: Promise<void>;
  private readonly now: () => number;
  private readonly random: () => number;
  /** Hot-path hit counter (see {@link MetricsService.l1HitCell}). */
  readonly l1Hits: HitCell;

  constructor(
    readonly client: ClientConfig,
    private readonly deps: ManagerDeps,
  ) {
    this.now = deps.now ?? Date.now;
    this.random = deps.random ?? Math.random;
    this.held = new HeldToken(client.id, { metrics: deps.metrics, now: this.now });
    this.l1Hits = deps.metrics.l1HitCell(client.id);
    this.refresh = new FleetRefresh(client, {
      store: deps.store,
      grantor: deps.grantor,
      credentials: new CredentialsCache(
        (stage) => deps.loadCredentials(client, stage),
        deps.settings.credentialsReloadSeconds * 1000,
        this.now,
        client.credentials.secretId !== undefined ? SECRETS_MANAGER_ROTATION_STAGES : [],
      ),
      metrics: deps.metrics,
      logger: deps.logger,
      storeGraceMs: deps.storeGraceMs,
      minRefreshIntervalMs: deps.settings.minRefreshIntervalMs,
      now: this.now,
    });
    this.standing = new RefreshStanding(
      client,
      { ...deps, now: this.now, random: this.random },
      this.waiters,
    );
    this.loop = new RefreshLoop(client, {
      refresh: this.refresh,
      held: this.held,
      standing: this.standing,
      waiters: this.waiters,
      logger: deps.logger,
      refreshAheadMs: deps.settings.refreshAheadSeconds * 1000,
      now: this.now,
      random: this.random,
      syncGeneration: () => this.syncGeneration(),
      adopt: (record, fetched) => this.adopt(record, fetched),
    });
  }

  /** Starts the lifecycle: load credentials and obtain the first token in the background. */
  start(): void {
    this.loop.ensureRefreshing('start');
  }

  /**
   * Stops timers and retries, waits (bounded) for a refresh in flight to finish, then fails
   * the waiters it did not answer. Waiters are failed last, not first: callers already waiting
   * for the refresh this replica is doing (SIGTERM mid-refresh) get its token instead of a 503.
   */
  async stop(timeoutMs = 5000): Promise<void> {
    await this.loop.stop(timeoutMs);
    this.waiters.rejectAll(shuttingDown());
  }

  /** Hot path: the L1 token if it has at least `minRemainingMs` left. No I/O, no promise. */
  peek(minRemainingMs: number): TokenRecord | undefined {
    return this.held.servable(minRemainingMs);
  }

  /**
   * A token with at least `minRemainingMs` left. Answers from L1 when it can; otherwise this
   * is the mandatory window: wait (bounded by `waitTimeoutMs`) for the single refresh.
   */
  async get(
    minRemainingMs: number,
    waitTimeoutMs = this.deps.settings.waitTimeoutMs,
  ): Promise<TokenRecord> {
    const hit = this.peek(minRemainingMs);
    if (hit) return hit;
    if (this.resyncing !== undefined) {
      await this.resyncing;
      const back = this.peek(minRemainingMs);
      if (back) return back;
    }
    if (this.loop.stopped) throw shuttingDown();
    this.standing.refuseBeforeWaiting(minRemainingMs, waitTimeoutMs);
    const needUntil = this.now() + Math.max(minRemainingMs, MIN_SERVE_MS);
    const result = this.waiters.wait(
      needUntil,
      waitTimeoutMs,
      () => this.standing.unavailable(minRemainingMs),
      minRemainingMs,
    );
    this.loop.ensureRefreshing('demand');
    return result;
  }

  /**
   * Generation-aware invalidation: the provider rejected the token with `fingerprint`. Drop it
   * only if it is still the current one, here and in the store, so a storm of rejections of
   * one stale token costs a single refresh. The fingerprint is remembered: this manager never
   * adopts that token again, so the next {@link get} waits for a different one.
   */
  async invalidate(fingerprint: string): Promise<boolean> {
    const dropped = this.held.reject(fingerprint);
    // Its replacement is needed now, whatever the floor (the store lifts the fleet's).
    this.refresh.liftLocalFloor();
    let invalidated = false;
    if (dropped) {
      invalidated = true;
      this.deps.logger.warn(
        { client: this.client.id, fingerprint },
        'provider rejected the current token; refreshing',
      );
    }
    try {
      invalidated = (await this.deps.store.invalidate(this.client.id, fingerprint)) || invalidated;
    } catch (err) {
      this.noteStoreFailure(err);
    }
    if (invalidated) this.loop.ensureRefreshing('invalidated');
    return invalidated;
  }

  /** A message from the shared store (another replica refreshed or invalidated). */
  onStoreEvent(event: TokenStoreEvent): void {
    if (event.type === 'revoked') {
      if (event.fingerprint !== undefined) this.held.refuse(event.fingerprint);
      this.refresh.liftLocalFloor();
      this.syncGeneration();
      return;
    }
    if (event.type === 'invalidated') {
      // Another replica saw the provider refuse it: it is no better here.
      const dropped = this.held.reject(event.fingerprint);
      this.refresh.liftLocalFloor();
      if (dropped) this.loop.ensureRefreshing('invalidated');
      return;
    }
    // Our own token (we wrote it, or already adopted it): nothing to re-read. Anything else
    // is re-read, and the adoption keeps whichever of the two expires later.
    const cur = this.held.current;
    if (cur !== undefined && event.fingerprint === cur.fingerprint) return;
    if (this.loop.running) {
      // The loop is waiting for exactly this: let it re-read now instead of at its next poll
      // (asleep: wake it; inside a pass: it looks again once the pass ends).
      this.loop.ring();
    } else {
      void this.adoptFromStore();
    }
  }

  /**
   * The store is reachable again after an outage: check the generation, push our token,
   * converge on the newest. Concurrent calls (the command and subscriber connections both
   * come back) share one run.
   */
  resync(): Promise<void> {
    this.resyncing ??= this.resyncOnce().finally(() => (this.resyncing = undefined));
    return this.resyncing;
  }

  private async resyncOnce(): Promise<void> {
    const held = this.held.current;
    if (!this.held.needsResync && held === undefined) return;
    // An operator may have revoked the token while this replica could not hear it: it is not
    // served again (this runs in the very tick the store is seen back) before this replica has
    // read the fleet's generation.
    this.held.setAside();
    try {
      await this.refresh.readShared();
      this.syncGeneration(held);
      if (held && this.held.ofGeneration(held) && held.expiresAt > this.now()) {
        if (this.held.current === undefined) this.adopt(held);
        await this.deps.store.writeFenced(this.client.id, held);
      }
      this.held.needsResync = false;
      await this.adoptFromStore();
      this.deps.logger.info({ client: this.client.id }, 'shared store back; token resynchronised');
    } catch (err) {
      // Down again: back to serving what this replica holds, as during any outage.
      this.held.restore(held);
      this.noteStoreFailure(err);
    }
  }

  /**
   * Forced refresh (see {@link FleetRefresh.forced}): the new token is this replica's at once;
   * the others adopt it from the store's notification.
   */
  async forceRefresh(
    askedAt: number,
  ): Promise<{ record: TokenRecord; fetched: boolean; written: boolean }> {
    const result = await this.refresh.forced(askedAt, this.deps.settings.waitTimeoutMs);
    this.syncGeneration();
    if (this.held.ofGeneration(result.record)) this.adopt(result.record, result.fetched, true);
    return result;
  }

  /** Re-reads this client's credentials now; whether they changed (see `CredentialsCache.reload`). */
  reloadCredentials(): Promise<'changed' | 'unchanged' | 'first'> {
    return this.refresh.reloadCredentials();
  }

  /** What the admin status shows of this client on this replica (fingerprints, never tokens). */
  adminStatus(): {
    fingerprint?: string;
    expiresAt?: number;
    obtainedAt?: number;
    generation: number;
    lastRefresh?: LastRefresh;
    lastError?: string;
    refreshing: boolean;
  } {
    const r = this.held.valid();
    const failure = this.standing.failure;
    return {
      fingerprint: r?.fingerprint,
      expiresAt: r?.expiresAt,
      obtainedAt: r?.obtainedAt,
      generation: this.held.generation,
      lastRefresh: this.held.lastRefresh,
      lastError: failure?.permanent?.operatorDetail ?? failure?.lastError.message,
      refreshing: this.loop.running,
    };
  }

  /**
   * Catches up with the store's generation: a token of an older one (revoked while this replica
   * held it) is dropped at once, never adopted again, and its replacement fetched; the store
   * hears that this replica did so. `held`: a token set aside by {@link resync}, judged too.
   */
  private syncGeneration(held?: TokenRecord): void {
    const generation = this.deps.store.generation(this.client.id);
    if (generation <= this.held.generation) return;
    const dropped = this.held.revoke(generation, held);
    if (dropped !== undefined) {
      this.deps.logger.warn(
        { client: this.client.id, fingerprint: dropped.fingerprint, generation },
        'token revoked fleet-wide; dropped and refreshing',
      );
    }
    this.deps.store
      .acknowledgeRevocation(this.client.id, generation)
      .catch((err: unknown) => this.noteStoreFailure(err));
    if (this.held.current === undefined) this.loop.ensureRefreshing('revoked');
  }

  status(): ClientTokenStatus {
    const r = this.held.valid();
    const failure = this.standing.failure;
    return {
      client: this.client.id,
      hasToken: r !== undefined,
      expiresAt: r?.expiresAt,
      refreshing: this.loop.running,
      permanentError: failure?.permanent
        ? { code: failure.permanent.code, message: failure.permanent.operatorDetail }
        : undefined,
      lastError: failure?.lastError.message,
      lifetimeError: this.standing.lifetimeError,
      nextAttemptAt: this.standing.nextAttemptAt,
      everObtained: this.held.everObtained,
    };
  }

  // ---------------------------------------------------------------------------------------

  /**
   * Makes `record` the L1 token (unless ours is newer), re-arms the refresh timer and answers
   * waiters. After a fresh fetch, a waiter the new token still cannot satisfy (it asked for
   * more than the provider's lifetime) is refused rather than made to trigger another fetch.
   */
  private adopt(record: TokenRecord, fetched = false, forced = false): void {
    const held = this.held.keep(record, forced);
    this.standing.noteLifetime(held.expiresAt - held.obtainedAt);
    this.loop.schedule(held);
    const lifetimeMs = held.expiresAt - held.obtainedAt;
    this.waiters.offer(
      held,
      fetched
        ? (requestedMs) =>
            lifetimeTooShort(this.client.id, lifetimeMs, requestedMs, this.standing.retryAfter())
        : undefined,
      this.now() + MIN_SERVE_MS,
    );
  }

  private async adoptFromStore(): Promise<void> {
    try {
      const r = await this.refresh.readShared();
      this.syncGeneration();
      if (r && this.held.mayHold(r) && this.held.outlastedBy(r)) {
        this.adopt(r);
        this.held.noteRefresh('adopted');
      }
    } catch (err) {
      this.noteStoreFailure(err);
    }
  }

  private noteStoreFailure(err: unknown): void {
    noteStoreFailure(this.deps.logger, this.client.id, err);
  }
}

function shuttingDown(): TokenException {
  return new TokenException(TokenErrorCode.ShuttingDown, 'the broker is shutting down', {
    retryAfterSeconds: 1,
  });
}
