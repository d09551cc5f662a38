import type { Logger } from 'pino';
import type { ClientConfig, TokenSettings } from '../config/config.schema';
import type { HitCell, MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { ClientCredentials } from '../secrets/client-credentials';
import { CredentialsCache, SECRETS_MANAGER_ROTATION_STAGES } from '../secrets/credentials-cache';
import { FleetRefresh, noteStoreFailure, type RefreshPass } from './fleet-refresh';
import { HeldToken, type LastRefresh } from './held-token';
import { lifetimeTooShort } from './refresh-failure';
import { isDue, MAX_TIMER_MS, MIN_SERVE_MS, refreshAt } from './refresh-schedule';
import { RefreshAlarm } from './refresh-alarm';
import { RefreshStanding } from './refresh-standing';
import type { TokenRecord } from './token-record';
import type { TokenStore, TokenStoreEvent } from './token-store';
import { TokenWaiters } from './token-waiters';
import { TokenErrorCode, TokenException } from './token.exception';
import { inSpan } from '../tracing/spans';

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
 * One client's token lifecycle, as a state machine: L1 (this object), L2 (the shared store),
 * source (the provider).
 *
 * - Hot path: {@link peek} reads L1 synchronously; no I/O.
 * - Refresh: a single loop per process (the single flight), started by the refresh-ahead timer,
 *   by a caller in the mandatory window, by an invalidation, or by a store event. Each pass is a
 *   {@link FleetRefresh} (L2, lock, L2 again, provider, fenced write); between passes the loop
 *   sleeps for the backoff {@link RefreshStanding} sets, or until a store event wakes it.
 * - Callers in the mandatory window wait in {@link TokenWaiters}, bounded by `waitTimeoutMs`.
 * - Failures: capped exponential backoff with full jitter; the current token keeps being
 *   served until it expires.
 */
export class ClientTokenManager {
  /** L1: the token this replica serves, and what it may hold. */
  private readonly held: HeldToken;
  private loop?: Promise<void>;
  private readonly waiters = new TokenWaiters();
  private readonly refresh: FleetRefresh;
  private refreshTimer?: NodeJS.Timeout;
  /** The loop's sleep between passes, cut short by store events and shutdown. */
  private readonly alarm = new RefreshAlarm();
  /** Passes in a row that found the lock held elsewhere: the next short wait doubles. */
  private holderWaits = 0;
  /** Failures, holds and the provider's lifetime: what a caller is told while it waits. */
  private readonly standing: RefreshStanding;
  private stopped = false;
  /**
   * Set while {@link resync} runs: L1 is set aside until the generation is read, and callers
   * missing it wait for this (a few Redis round trips) rather than start a refresh of their own,
   * which could ask the provider for a token the set-aside one is about to cover.
   */
  private resyncing?: Promise<void>;
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly refreshAheadMs: number;
  /** Hot-path hit counter (see {@link MetricsService.l1HitCell}). */
  readonly l1Hits: HitCell;

  constructor(
    readonly client: ClientConfig,
    private readonly deps: ManagerDeps,
  ) {
    this.now = deps.now ?? Date.now;
    this.random = deps.random ?? Math.random;
    this.refreshAheadMs = deps.settings.refreshAheadSeconds * 1000;
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
  }

  /** Starts the lifecycle: load credentials and obtain the first token in the background. */
  start(): void {
    this.ensureRefreshing('start');
  }

  /**
   * Stops timers and retries, waits (bounded) for a refresh in flight to finish, then fails
   * the waiters it did not answer. Waiters are failed last, not first: callers already waiting
   * for the refresh this replica is doing (SIGTERM mid-refresh) get its token instead of a 503.
   */
  async stop(timeoutMs = 5000): Promise<void> {
    this.stopped = true;
    clearTimeout(this.refreshTimer);
    // A loop sleeping between attempts ends now; one inside an attempt finishes it first.
    this.alarm.wakeIfAsleep();
    if (this.loop) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.loop,
        new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs))),
      ]);
      clearTimeout(timer);
    }
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
    if (this.stopped) throw shuttingDown();
    this.standing.refuseBeforeWaiting(minRemainingMs, waitTimeoutMs);
    const needUntil = this.now() + Math.max(minRemainingMs, MIN_SERVE_MS);
    const result = this.waiters.wait(
      needUntil,
      waitTimeoutMs,
      () => this.standing.unavailable(minRemainingMs),
      minRemainingMs,
    );
    this.ensureRefreshing('demand');
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
    if (invalidated) this.ensureRefreshing('invalidated');
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
      if (dropped) this.ensureRefreshing('invalidated');
      return;
    }
    // Our own token (we wrote it, or already adopted it): nothing to re-read. Anything else
    // is re-read, and the adoption keeps whichever of the two expires later.
    const cur = this.held.current;
    if (cur !== undefined && event.fingerprint === cur.fingerprint) return;
    if (this.loop) {
      // The loop is waiting for exactly this: let it re-read now instead of at its next poll
      // (asleep: wake it; inside a pass: it looks again once the pass ends).
      this.alarm.ring();
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
      refreshing: this.loop !== undefined,
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
    if (this.held.current === undefined) this.ensureRefreshing('revoked');
  }

  status(): ClientTokenStatus {
    const r = this.held.valid();
    const failure = this.standing.failure;
    return {
      client: this.client.id,
      hasToken: r !== undefined,
      expiresAt: r?.expiresAt,
      refreshing: this.loop !== undefined,
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

  private ensureRefreshing(reason: string): void {
    if (this.loop || this.stopped) return;
    this.deps.logger.debug({ client: this.client.id, reason }, 'token refresh started');
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      // A caller may have arrived with a stricter need while the loop was finishing.
      if (this.waiters.size > 0 && !this.stopped && !this.standing.failure?.permanent)
        this.ensureRefreshing('pending');
    });
  }

  private async runLoop(): Promise<void> {
    this.holderWaits = 0;
    while (!this.stopped) {
      let next: number | 'done';
      this.alarm.passStarted();
      try {
        const pass = await inSpan('token.refresh', { 'token_broker.client': this.client.id }, () =>
          this.refresh.run({
            held: () => this.held.current,
            goodEnough: (r) => this.isGoodEnough(r),
            failed: (err) => this.onAttemptFailed(err),
          }),
        );
        // The pass read the store: a revoke it learnt of drops what it must.
        this.syncGeneration();
        next = this.afterPass(pass);
      } catch (err) {
        next = this.onAttemptFailed(err);
        this.standing.hold(next);
      }
      // Done, or shutting down: no further attempt (stop() is waiting for this loop to end).
      if (next === 'done' || this.stopped) return;
      this.standing.nextAttemptAt = this.now() + next;
      await this.alarm.sleep(next);
    }
  }

  /** Acts on one pass: its token adopted (`'done'`), or how long until the next pass. */
  private afterPass(pass: RefreshPass): number | 'done' {
    if (pass.kind === 'floor') {
      // A token was granted less than the floor ago: the callers it does not satisfy (a
      // min_ttl near the lifetime, or a lifetime too short) wait for the floor's end. Its
      // lifetime tells this replica what the provider grants, even if it was unusable.
      if (pass.lifetimeMs !== undefined) this.standing.noteLifetime(pass.lifetimeMs);
      this.standing.hold(pass.retryInMs, true);
      this.holderWaits = 0;
      return pass.retryInMs;
    }
    if (pass.kind === 'unusable') {
      // Granted, but too short-lived to hand out: neither stored nor served.
      this.standing.noteLifetime(pass.lifetimeMs);
      this.standing.hold(pass.retryInMs, true);
      this.holderWaits = 0;
      return pass.retryInMs;
    }
    if (pass.kind === 'wait') {
      // Another replica holds the lock: wait for its pub/sub message, re-read regardless.
      // The message may already have come during this pass: then re-read now.
      return this.alarm.wokenDuringPass ? 0 : Math.min(100 * 2 ** this.holderWaits++, 1000);
    }
    if (pass.kind !== 'token') {
      // Deferred or failed: no provider request before `retryInMs`.
      this.standing.hold(pass.retryInMs);
      // When the deferral ends the replicas race for the lock again: the losers must look
      // again soon, to learn the next deferral while their callers still wait.
      this.holderWaits = 0;
      return pass.retryInMs;
    }
    return this.takeToken(pass);
  }

  /** A pass brought a token: adopted (`'done'`), unless it is already outdated or refused. */
  private takeToken(pass: Extract<RefreshPass, { kind: 'token' }>): number | 'done' {
    // Requested before a revoke that arrived meanwhile: the fence refused it, and it is not
    // served either. Look again: the next pass asks in the new generation.
    if (!this.held.ofGeneration(pass.record)) return 0;
    // Refused by the provider after the pass judged it (the pass still awaited the lock's
    // release): adopting it would hand the rejected token straight back to the caller
    // retrying after its 401. Look again: the store no longer offers it.
    if (this.held.isRejected(pass.record.fingerprint)) return 0;
    if (pass.unshared) this.held.needsResync = true;
    this.adopt(pass.record, pass.fetched);
    this.held.noteRefresh(pass.fetched ? 'fetched' : 'adopted');
    this.standing.settle();
    return 'done';
  }

  /**
   * Whether `r` ends the refresh: outside its refresh window and enough for every waiter.
   * Judged by the token alone, not by "is it the one we hold": another path (a pub/sub wake-up,
   * a resync) may have adopted the fleet's new token while this pass was in flight, and the
   * pass must then stop instead of fetching one more.
   */
  private isGoodEnough(r: TokenRecord): boolean {
    if (this.held.isRejected(r.fingerprint)) return false;
    if (isDue(this.refreshAheadMs, r.obtainedAt, r.expiresAt, this.now())) return false;
    return this.waiters.allMetBy(r, this.now() + MIN_SERVE_MS);
  }

  /**
   * Makes `record` the L1 token (unless ours is newer), re-arms the refresh timer and answers
   * waiters. After a fresh fetch, a waiter the new token still cannot satisfy (it asked for
   * more than the provider's lifetime) is refused rather than made to trigger another fetch.
   */
  private adopt(record: TokenRecord, fetched = false, forced = false): void {
    const held = this.held.keep(record, forced);
    this.standing.noteLifetime(held.expiresAt - held.obtainedAt);
    this.schedule(held);
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

  private schedule(record: TokenRecord): void {
    clearTimeout(this.refreshTimer);
    const at = refreshAt(this.refreshAheadMs, record.obtainedAt, record.expiresAt, this.random);
    // Lifetimes are capped at a day, far below the timer's limit; clamp anyway, since a longer
    // delay would make setTimeout fire at once (a refresh loop).
    this.refreshTimer = setTimeout(
      () => this.ensureRefreshing('scheduled'),
      Math.min(MAX_TIMER_MS, Math.max(0, at - this.now())),
    );
    this.refreshTimer.unref();
  }

  /** Records a failed pass (see {@link RefreshStanding.failed}); how long to wait. */
  private onAttemptFailed(err: unknown): number {
    this.held.noteRefresh('failed');
    return this.standing.failed(err, this.held.valid()?.expiresAt);
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
