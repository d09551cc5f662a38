import type { Logger } from 'pino';
import type { ClientConfig, TokenSettings } from '../config/config.schema';
import type { HitCell, MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { ClientCredentials } from '../secrets/client-credentials';
import { CredentialsCache, SECRETS_MANAGER_ROTATION_STAGES } from '../secrets/credentials-cache';
import { FleetRefresh, noteStoreFailure } from './fleet-refresh';
import {
  judgeFailure,
  lifetimeProblem,
  lifetimeTooShort,
  refreshFloorHeld,
  unavailableError,
} from './refresh-failure';
import { afterFailure, failureOf, holding, type RefreshPhase, SETTLED } from './refresh-phase';
import { isDue, MAX_TIMER_MS, MIN_SERVE_MS, neededLifetimeMs, refreshAt } from './refresh-schedule';
import type { TokenRecord } from './token-record';
import type { TokenStore, TokenStoreEvent } from './token-store';
import { TokenWaiters } from './token-waiters';
import { TokenErrorCode, TokenException } from './token.exception';
import { inSpan } from '../tracing/spans';

export { MIN_SERVE_MS };

/**
 * How many rejected fingerprints a manager remembers. A rejected token is gone from the store
 * within a refresh or two; the newest few cover every read that can still be in flight.
 */
const REMEMBERED_REJECTIONS = 16;

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
   * (see {@link neededLifetimeMs}): names the lifetime and the setting involved.
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
 *   sleeps for the backoff of {@link judgeFailure}, or until a store event wakes it.
 * - Callers in the mandatory window wait in {@link TokenWaiters}, bounded by `waitTimeoutMs`.
 * - Failures: capped exponential backoff with full jitter; the current token keeps being
 *   served until it expires.
 */
export class ClientTokenManager {
  private l1?: TokenRecord;
  private loop?: Promise<void>;
  private readonly waiters = new TokenWaiters();
  private readonly refresh: FleetRefresh;
  private refreshTimer?: NodeJS.Timeout;
  private wake?: () => void;
  /**
   * A store event arrived while the loop was inside a pass (not asleep, so {@link wake} could
   * not reach it): the pass may have read the store before the news, so the loop must look again
   * at once instead of sleeping on a wake-up it already received.
   */
  private wokenDuringPass = false;
  /** Failures and holds since the last token (see {@link RefreshPhase}). */
  private phase: RefreshPhase = SETTLED;
  /** When the loop's next pass is due (a hold's end, or a short wait for another replica). */
  private nextAttemptAt?: number;
  private everObtained = false;
  /**
   * Lifetime of the newest token obtained (ms): what a refresh can offer a caller at most;
   * `problem` while it is too short to serve and refresh (see {@link noteLifetime}).
   */
  private lifetime?: { ms: number; problem?: string };
  /** L1 holds a token the shared store may lack (it was down): push it on recovery. */
  private needsResync = false;
  /**
   * Fingerprints the provider refused (oldest first). Never adopted again, whether from a pass,
   * a store read or a pub/sub message that started before the rejection: so a caller asking
   * after {@link invalidate} gets a different token without polling.
   */
  private readonly rejected = new Set<string>();
  private stopped = false;
  /** The fleet's revocation generation as this replica knows it (see `TokenStore.revoke`). */
  private generation = 0;
  /**
   * Set while {@link resync} runs: L1 is set aside until the generation is read, and callers
   * missing it wait for this (a few Redis round trips) rather than start a refresh of their own,
   * which could ask the provider for a token the set-aside one is about to cover.
   */
  private resyncing?: Promise<void>;
  /** When this replica last adopted or obtained a token, and how (admin status). */
  private lastRefresh?: { at: number; outcome: 'fetched' | 'adopted' | 'failed' };
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly refreshAheadMs: number;
  private readonly minRefreshIntervalMs: number;
  private readonly remainingGauge;
  /** Hot-path hit counter (see {@link MetricsService.l1HitCell}). */
  readonly l1Hits: HitCell;

  constructor(
    readonly client: ClientConfig,
    private readonly deps: ManagerDeps,
  ) {
    this.now = deps.now ?? Date.now;
    this.random = deps.random ?? Math.random;
    this.refreshAheadMs = deps.settings.refreshAheadSeconds * 1000;
    this.minRefreshIntervalMs = deps.settings.minRefreshIntervalMs;
    this.remainingGauge = deps.metrics.tokenRemaining.labels(client.id);
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
      minRefreshIntervalMs: this.minRefreshIntervalMs,
      now: this.now,
    });
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
    this.wake?.();
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
    const r = this.l1;
    return r !== undefined && r.expiresAt - this.now() >= Math.max(minRemainingMs, MIN_SERVE_MS)
      ? r
      : undefined;
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
    // Fail fast: an operator must fix this; the loop keeps probing in the background.
    const permanent = failureOf(this.phase)?.permanent;
    if (permanent) throw permanent;
    // Even a brand-new token could not meet this: refuse now instead of fetching one per
    // such request (a caller looping with a too large min_ttl would hammer the provider).
    const needMs = Math.max(minRemainingMs, MIN_SERVE_MS);
    if (this.lifetime !== undefined && needMs >= this.lifetime.ms) {
      // Without a min_ttl, the next grant may be longer-lived: point at it (or the floor).
      const retryAfter =
        minRemainingMs > 0
          ? undefined
          : (this.retryAfter() ?? Math.ceil(this.minRefreshIntervalMs / 1000));
      throw lifetimeTooShort(this.client.id, this.lifetime.ms, minRemainingMs, retryAfter);
    }
    // The fleet backs off (or the refresh floor holds) past this caller's wait: no token can
    // come in time, so say at once when the next attempt is instead of holding the caller.
    if ('until' in this.phase && this.phase.until - this.now() > waitTimeoutMs) {
      throw this.unavailable(minRemainingMs);
    }
    const needUntil = this.now() + needMs;
    const result = this.waiters.wait(
      needUntil,
      waitTimeoutMs,
      () => this.unavailable(minRemainingMs),
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
    this.remember(fingerprint);
    // Its replacement is needed now, whatever the floor (the store lifts the fleet's).
    this.refresh.liftLocalFloor();
    let invalidated = false;
    if (this.l1?.fingerprint === fingerprint) {
      this.l1 = undefined;
      this.remainingGauge.set(0);
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
      if (event.fingerprint !== undefined) this.remember(event.fingerprint);
      this.refresh.liftLocalFloor();
      this.syncGeneration();
      return;
    }
    if (event.type === 'invalidated') {
      // Another replica saw the provider refuse it: it is no better here.
      this.remember(event.fingerprint);
      this.refresh.liftLocalFloor();
      if (this.l1?.fingerprint === event.fingerprint) {
        this.l1 = undefined;
        this.remainingGauge.set(0);
        this.ensureRefreshing('invalidated');
      }
      return;
    }
    // Our own token (we wrote it, or already adopted it): nothing to re-read. Anything else
    // is re-read, and the adoption keeps whichever of the two expires later.
    if (this.l1 !== undefined && event.fingerprint === this.l1.fingerprint) return;
    if (this.loop) {
      // The loop is waiting for exactly this: let it re-read now instead of at its next poll
      // (asleep: wake it; inside a pass: it looks again once the pass ends).
      if (this.wake) this.wake();
      else this.wokenDuringPass = true;
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
    const held = this.l1;
    if (!this.needsResync && held === undefined) return;
    // An operator may have revoked the token while this replica could not hear it: it is not
    // served again (this runs in the very tick the store is seen back) before this replica has
    // read the fleet's generation.
    this.l1 = undefined;
    try {
      await this.refresh.readShared();
      this.syncGeneration(held);
      if (held && (held.generation ?? 0) >= this.generation && held.expiresAt > this.now()) {
        if (this.l1 === undefined) this.adopt(held);
        await this.deps.store.writeFenced(this.client.id, held);
      }
      this.needsResync = false;
      await this.adoptFromStore();
      this.deps.logger.info({ client: this.client.id }, 'shared store back; token resynchronised');
    } catch (err) {
      // Down again: back to serving what this replica holds, as during any outage.
      if (this.l1 === undefined && held && (held.generation ?? 0) >= this.generation) {
        this.l1 = held;
      }
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
    if ((result.record.generation ?? 0) >= this.generation) {
      this.l1 = result.record;
      this.adopt(result.record, result.fetched);
    }
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
    lastRefresh?: { at: number; outcome: 'fetched' | 'adopted' | 'failed' };
    lastError?: string;
    refreshing: boolean;
  } {
    const r = this.l1 && this.l1.expiresAt > this.now() ? this.l1 : undefined;
    const failure = failureOf(this.phase);
    return {
      fingerprint: r?.fingerprint,
      expiresAt: r?.expiresAt,
      obtainedAt: r?.obtainedAt,
      generation: this.generation,
      lastRefresh: this.lastRefresh,
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
    if (generation <= this.generation) return;
    this.generation = generation;
    for (const r of [this.l1, held]) {
      if (r !== undefined && (r.generation ?? 0) < generation) this.remember(r.fingerprint);
    }
    if (this.l1 !== undefined && (this.l1.generation ?? 0) < generation) {
      this.deps.logger.warn(
        { client: this.client.id, fingerprint: this.l1.fingerprint, generation },
        'token revoked fleet-wide; dropped and refreshing',
      );
      this.l1 = undefined;
      this.remainingGauge.set(0);
    }
    this.deps.store
      .acknowledgeRevocation(this.client.id, generation)
      .catch((err: unknown) => this.noteStoreFailure(err));
    if (this.l1 === undefined) this.ensureRefreshing('revoked');
  }

  status(): ClientTokenStatus {
    const r = this.l1 && this.l1.expiresAt > this.now() ? this.l1 : undefined;
    const failure = failureOf(this.phase);
    return {
      client: this.client.id,
      hasToken: r !== undefined,
      expiresAt: r?.expiresAt,
      refreshing: this.loop !== undefined,
      permanentError: failure?.permanent
        ? { code: failure.permanent.code, message: failure.permanent.operatorDetail }
        : undefined,
      lastError: failure?.lastError.message,
      lifetimeError: this.lifetime?.problem,
      nextAttemptAt: this.nextAttemptAt,
      everObtained: this.everObtained,
    };
  }

  // ---------------------------------------------------------------------------------------

  private ensureRefreshing(reason: string): void {
    if (this.loop || this.stopped) return;
    this.deps.logger.debug({ client: this.client.id, reason }, 'token refresh started');
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      // A caller may have arrived with a stricter need while the loop was finishing.
      if (this.waiters.size > 0 && !this.stopped && !failureOf(this.phase)?.permanent)
        this.ensureRefreshing('pending');
    });
  }

  private async runLoop(): Promise<void> {
    let waits = 0;
    while (!this.stopped) {
      let delay: number;
      this.wokenDuringPass = false;
      try {
        const pass = await inSpan('token.refresh', { 'token_broker.client': this.client.id }, () =>
          this.refresh.run({
            held: () => this.l1,
            goodEnough: (r) => this.isGoodEnough(r),
            failed: (err) => this.onAttemptFailed(err),
          }),
        );
        // The pass read the store: a revoke it learnt of drops what it must.
        this.syncGeneration();
        if (pass.kind === 'floor') {
          // A token was granted less than the floor ago: the callers it does not satisfy (a
          // min_ttl near the lifetime, or a lifetime too short) wait for the floor's end. Its
          // lifetime tells this replica what the provider grants, even if it was unusable.
          if (pass.lifetimeMs !== undefined) this.noteLifetime(pass.lifetimeMs);
          delay = pass.retryInMs;
          this.enterBackoff(delay, true);
          waits = 0;
        } else if (pass.kind === 'unusable') {
          // Granted, but too short-lived to hand out: neither stored nor served.
          this.noteLifetime(pass.lifetimeMs);
          delay = pass.retryInMs;
          this.enterBackoff(delay, true);
          waits = 0;
        } else if (pass.kind === 'deferred' || pass.kind === 'failed') {
          delay = pass.retryInMs;
          this.enterBackoff(delay);
          // When the deferral ends the replicas race for the lock again: the losers must look
          // again soon, to learn the next deferral while their callers still wait.
          waits = 0;
        } else if (pass.kind === 'token' && (pass.record.generation ?? 0) < this.generation) {
          // Requested before a revoke that arrived meanwhile: the fence refused it, and it is
          // not served either. Look again: the next pass asks in the new generation.
          delay = 0;
        } else if (pass.kind === 'token' && this.rejected.has(pass.record.fingerprint)) {
          // Refused by the provider after the pass judged it (the pass still awaited the lock's
          // release): adopting it would hand the rejected token straight back to the caller
          // retrying after its 401. Look again: the store no longer offers it.
          delay = 0;
        } else if (pass.kind === 'token') {
          if (pass.unshared) this.needsResync = true;
          this.adopt(pass.record, pass.fetched);
          this.lastRefresh = { at: this.now(), outcome: pass.fetched ? 'fetched' : 'adopted' };
          this.phase = SETTLED;
          this.nextAttemptAt = undefined;
          return;
        } else {
          // Another replica holds the lock: wait for its pub/sub message, re-read regardless.
          // The message may already have come during this pass: then re-read now.
          delay = this.wokenDuringPass ? 0 : Math.min(100 * 2 ** waits++, 1000);
        }
      } catch (err) {
        delay = this.onAttemptFailed(err);
        this.enterBackoff(delay);
      }
      // Shutting down: no further attempt (stop() is waiting for this loop to end).
      if (this.stopped) return;
      this.nextAttemptAt = this.now() + delay;
      await this.sleep(delay);
    }
  }

  /**
   * Whether `r` ends the refresh: outside its refresh window and enough for every waiter.
   * Judged by the token alone, not by "is it the one we hold": another path (a pub/sub wake-up,
   * a resync) may have adopted the fleet's new token while this pass was in flight, and the
   * pass must then stop instead of fetching one more.
   */
  private isGoodEnough(r: TokenRecord): boolean {
    if (this.rejected.has(r.fingerprint)) return false;
    if (isDue(this.refreshAheadMs, r.obtainedAt, r.expiresAt, this.now())) return false;
    return this.waiters.allMetBy(r, this.now() + MIN_SERVE_MS);
  }

  /**
   * Makes `record` the L1 token (unless ours is newer), re-arms the refresh timer and answers
   * waiters. After a fresh fetch, a waiter the new token still cannot satisfy (it asked for
   * more than the provider's lifetime) is refused rather than made to trigger another fetch.
   */
  private adopt(record: TokenRecord, fetched = false): void {
    const cur = this.l1;
    if (!cur || record.expiresAt > cur.expiresAt || record.fingerprint !== cur.fingerprint) {
      if (!cur || record.expiresAt >= cur.expiresAt) this.l1 = record;
    }
    const held = this.l1!;
    this.everObtained = true;
    this.noteLifetime(held.expiresAt - held.obtainedAt);
    this.remainingGauge.set(Math.max(0, (held.expiresAt - this.now()) / 1000));
    this.deps.metrics.lastRefreshSuccess.labels(this.client.id).set(this.now() / 1000);
    this.schedule(held);
    const lifetimeMs = held.expiresAt - held.obtainedAt;
    this.waiters.offer(
      held,
      fetched
        ? (requestedMs) =>
            lifetimeTooShort(this.client.id, lifetimeMs, requestedMs, this.retryAfter())
        : undefined,
      this.now() + MIN_SERVE_MS,
    );
  }

  /**
   * Records the provider's lifetime; says once per transition (log and readiness) when it
   * is too short to serve and refresh under the floor, and once when it no longer is.
   */
  private noteLifetime(lifetimeMs: number): void {
    const known = this.lifetime?.problem;
    const problem =
      lifetimeMs < neededLifetimeMs(this.minRefreshIntervalMs)
        ? lifetimeProblem(this.client.id, lifetimeMs, this.minRefreshIntervalMs)
        : undefined;
    this.lifetime = { ms: lifetimeMs, problem };
    if (problem !== undefined && known === undefined) {
      this.deps.logger.error(
        { client: this.client.id, lifetimeMs, minRefreshIntervalMs: this.minRefreshIntervalMs },
        problem,
      );
    } else if (problem === undefined && known !== undefined) {
      this.deps.logger.info(
        { client: this.client.id, lifetimeMs },
        "the provider's token lifetime is long enough again",
      );
    }
  }

  private async adoptFromStore(): Promise<void> {
    try {
      const r = await this.refresh.readShared();
      this.syncGeneration();
      if (
        r &&
        !this.rejected.has(r.fingerprint) &&
        (r.generation ?? 0) >= this.generation &&
        (!this.l1 || r.expiresAt > this.l1.expiresAt)
      ) {
        this.adopt(r);
        this.lastRefresh = { at: this.now(), outcome: 'adopted' };
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

  /** Records a failed pass and returns how long to wait before the next one. */
  private onAttemptFailed(err: unknown): number {
    const lastError = err instanceof Error ? err : new Error(String(err));
    const attempt = (failureOf(this.phase)?.count ?? 0) + 1;
    this.lastRefresh = { at: this.now(), outcome: 'failed' };
    const valid = this.l1 && this.l1.expiresAt > this.now() ? this.l1 : undefined;
    const verdict = judgeFailure(err, {
      client: this.client,
      attempt,
      backoffBaseMs: this.deps.settings.backoffBaseMs,
      backoffMaxMs: this.deps.settings.backoffMaxMs,
      now: this.now(),
      servingUntil: valid?.expiresAt,
      random: this.random,
    });
    this.deps.metrics.refreshes.labels(this.client.id, verdict.result).inc();
    this.phase = afterFailure(this.phase, lastError, verdict.permanent);
    const logFields = {
      client: this.client.id,
      attempt,
      code: (err as { code?: string }).code,
      err: lastError.message,
      servingUntil: valid ? new Date(valid.expiresAt).toISOString() : undefined,
    };
    if (verdict.permanent) {
      this.deps.logger.error(
        logFields,
        `token refresh failed permanently: ${verdict.permanent.operatorDetail}`,
      );
      this.waiters.rejectAll(verdict.permanent);
    } else {
      this.deps.logger.warn(logFields, 'token refresh failed; will retry');
    }
    return verdict.delayMs;
  }

  /**
   * No provider request for `delayMs`. Callers waiting now whose wait cannot outlast that are
   * refused at once, with the real time of the next attempt in `Retry-After`.
   */
  private enterBackoff(delayMs: number, floor = false): void {
    this.nextAttemptAt = this.now() + delayMs;
    this.phase = holding(this.phase, this.nextAttemptAt, floor);
    if (delayMs > this.deps.settings.waitTimeoutMs) {
      this.waiters.rejectAll((requestedMs) => this.unavailable(requestedMs));
    }
  }

  /** Seconds until the next attempt, for `Retry-After` (undefined: none planned). */
  private retryAfter(): number | undefined {
    return this.nextAttemptAt !== undefined && this.nextAttemptAt > this.now()
      ? Math.max(1, Math.ceil((this.nextAttemptAt - this.now()) / 1000))
      : undefined;
  }

  /**
   * The 503 (or permanent failure) for a caller no token can reach in time (`requestedMs`:
   * its min_ttl, 0 when it sent none): a lifetime too short to serve, the refresh floor, or
   * the last failure, whichever holds the token back.
   */
  private unavailable(requestedMs = 0): TokenException {
    const failure = failureOf(this.phase);
    if (failure?.permanent) return failure.permanent;
    if (this.lifetime?.problem !== undefined) {
      return new TokenException(TokenErrorCode.Unavailable, this.lifetime.problem, {
        retryAfterSeconds: this.retryAfter() ?? 1,
      });
    }
    if (
      this.phase.kind === 'floor' &&
      this.nextAttemptAt !== undefined &&
      this.nextAttemptAt > this.now()
    ) {
      return refreshFloorHeld({
        clientId: this.client.id,
        requestedMs,
        minRefreshIntervalMs: this.minRefreshIntervalMs,
        retryAfterMs: this.nextAttemptAt - this.now(),
      });
    }
    return unavailableError({
      clientId: this.client.id,
      permanent: failure?.permanent,
      lastError: failure?.lastError,
      nextAttemptAt: this.nextAttemptAt,
      now: this.now(),
    });
  }

  private remember(fingerprint: string): void {
    this.rejected.delete(fingerprint);
    this.rejected.add(fingerprint);
    if (this.rejected.size > REMEMBERED_REJECTIONS) {
      this.rejected.delete(this.rejected.values().next().value!);
    }
  }

  private noteStoreFailure(err: unknown): void {
    noteStoreFailure(this.deps.logger, this.client.id, err);
  }

  /** Sleeps for `ms`, or less if a store event or shutdown wakes the loop. */
  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        // Awake: a later event must not be spent on this finished sleep.
        if (this.wake === done) this.wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wake = done;
    });
  }
}

function shuttingDown(): TokenException {
  return new TokenException(TokenErrorCode.ShuttingDown, 'the broker is shutting down', {
    retryAfterSeconds: 1,
  });
}
