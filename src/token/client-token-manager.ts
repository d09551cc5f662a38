import { setTimeout as sleep } from 'node:timers/promises';
import type { ClientConfig } from '../config/client.schema';
import type { TokenSettings } from '../config/config.schema';
import type { HitCell, MetricsService } from '../metrics/metrics.service';
import type { ClientCredentials } from '../secrets/client-credentials';
import { CredentialsCache, SECRETS_MANAGER_ROTATION_STAGES } from '../secrets/credentials-cache';
import { inSpan } from '../tracing/spans';
import {
  FleetRefresh,
  type FleetRefreshDeps,
  type Forced,
  noteStoreFailure,
  type RefreshPass,
} from './fleet-refresh';
import { HeldToken } from './held-token';
import {
  judgeFailure,
  lifetimeProblem,
  lifetimeTooShort,
  refreshFloorHeld,
  unavailableError,
} from './refresh-failure';
import {
  clientPhase,
  isDue,
  MAX_TIMER_MS,
  MIN_SERVE_MS,
  refreshAt,
  retryAfterSeconds,
} from './refresh-schedule';
import { RejectionLedger } from './rejection-ledger';
import {
  afterFailure,
  type Failure,
  failureOf,
  holderWaitMs,
  holding,
  type Lifetime,
  lifecycleOf,
  meets,
  noteLifetime,
  type RefreshPhase,
  refusalOf,
  SETTLED,
} from './token-lifecycle';
import type { TokenRecord } from './token-record';
import type {
  RejectionRule,
  RejectionVerdict,
  StoredToken,
  TokenStore,
  TokenStoreEvent,
} from './token-store';
import { TokenErrorCode, TokenException } from './token.exception';

/** How often {@link ClientTokenManager.replacementAfter} looks. */
const REPLACEMENT_POLL_MS = 25;

/** Shared by every client's manager (and its refresh pass): nothing in it is one client's. */
interface ManagerDeps
  extends Pick<FleetRefreshDeps, 'grantor' | 'logger' | 'storeGraceMs' | 'endpointCap' | 'gates'> {
  store: TokenStore;
  /** `stage`: a Secrets Manager staging label instead of the current one. */
  loadCredentials: (client: ClientConfig, stage?: string) => Promise<ClientCredentials>;
  metrics: MetricsService;
  settings: TokenSettings;
  now?: () => number;
  random?: () => number;
}

/** A caller in the mandatory window, waiting for a token that meets its need. */
interface Waiter {
  needUntil: number;
  /** The caller's `min_ttl` (ms; 0: none), for what it is told on refusal. */
  requestedMs: number;
  resolve: (r: TokenRecord) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * One client's token lifecycle, the one state machine of that client: L1 (a {@link HeldToken}),
 * L2 (the shared store) and the source (the provider, through a {@link FleetRefresh} pass), with
 * one refresh loop per process and bounded waits for callers who need more. Every mutable field
 * of a client's refresh is below; the transitions' rules are pure functions in
 * `token-lifecycle.ts`, `refresh-schedule.ts` and `refresh-failure.ts`.
 */
export class ClientTokenManager {
  private readonly held: HeldToken;
  private readonly refresh: FleetRefresh;
  /** Made when first needed: only while the store is down (a few hundred bytes per client). */
  private localRejections?: RejectionLedger;
  private readonly now: () => number;
  private readonly random: () => number;
  /** Where in the refresh window this client refreshes, the same on every replica. */
  private readonly spreadPhase: number;
  readonly l1Hits: HitCell;
  readonly credentials: CredentialsCache;

  private phase: RefreshPhase = SETTLED;
  /** Made for the first caller who waits: most clients have none, and an empty set costs. */
  private waiters?: Set<Waiter>;
  /** The single flight of this client's refresh in this process. */
  private loop?: Promise<void>;
  private refreshTimer?: NodeJS.Timeout;
  /** Ends the loop's sleep early: a store event or shutdown. */
  private wake?: () => void;
  /** News that arrived during a pass, which may have read the store before it: look again. */
  private newsDuringPass = false;
  /** Passes in a row that found the lock held elsewhere: the next short wait doubles. */
  private holderWaits = 0;
  /** A hold's end, or a short wait for another replica. */
  private nextAttemptAt?: number;
  private lifetime?: Lifetime;
  /** Set while {@link resync} runs: callers wait for it rather than start a refresh. */
  private resyncing?: Promise<void>;
  private stopped = false;

  constructor(
    readonly client: ClientConfig,
    private readonly deps: ManagerDeps,
  ) {
    this.now = deps.now ?? Date.now;
    this.random = deps.random ?? Math.random;
    this.spreadPhase = clientPhase(client.id);
    this.held = new HeldToken(this.now);
    this.l1Hits = deps.metrics.l1HitCell();
    this.credentials = new CredentialsCache(
      (stage) => deps.loadCredentials(client, stage),
      deps.settings.credentialsReloadSeconds * 1000,
      this.now,
      client.credentials.secretId !== undefined ? SECRETS_MANAGER_ROTATION_STAGES : [],
    );
    this.refresh = new FleetRefresh(client, deps, this.credentials);
  }

  /** `seed`: this client's stored token, read with every other client's in a few round trips. */
  start(seed?: StoredToken): void {
    if (seed?.status === 'found') {
      this.deps.metrics.cacheLookups.labels('l2', 'hit').inc();
      this.adoptShared(seed.record);
    }
    this.ensureRefreshing('start');
  }

  /** Waiters are failed last, so callers of a refresh in flight at SIGTERM get its token. */
  async stop(timeoutMs: number): Promise<void> {
    this.stopped = true;
    clearTimeout(this.refreshTimer);
    // A loop sleeping between attempts, or waiting its turn, ends now; one inside an attempt
    // finishes it first.
    this.wake?.();
    this.refresh.stopWaiting();
    if (this.loop) await Promise.race([this.loop, sleep(timeoutMs, undefined, { ref: false })]);
    this.rejectWaiters(shuttingDown());
  }

  peek(minRemainingMs: number): TokenRecord | undefined {
    return this.held.servable(minRemainingMs);
  }

  get(minRemainingMs: number): Promise<TokenRecord> {
    return this.obtain(minRemainingMs, (ms) => this.peek(ms));
  }

  /** For a call the broker forwards: never a token the provider refused. */
  getForwardable(minRemainingMs: number): Promise<TokenRecord> {
    return this.obtain(minRemainingMs, (ms) => this.held.forwardable(ms));
  }

  /** What `pick` finds held, after a resync in progress if need be, else the refresh's token. */
  private async obtain(
    minRemainingMs: number,
    pick: (minRemainingMs: number) => TokenRecord | undefined,
  ): Promise<TokenRecord> {
    const hit = pick(minRemainingMs);
    if (hit || this.resyncing === undefined) return hit ?? this.waitFor(minRemainingMs);
    await this.resyncing;
    return pick(minRemainingMs) ?? this.waitFor(minRemainingMs);
  }

  /**
   * A caller who found no servable token waits for the refresh this starts, or is refused at once
   * when no token can reach it in time.
   */
  private waitFor(minRemainingMs: number): Promise<TokenRecord> {
    if (this.stopped) return Promise.reject(shuttingDown());
    const { settings } = this.deps;
    const refusal = refusalOf({
      phase: this.phase,
      lifetimeMs: this.lifetime?.ms,
      minRemainingMs,
      waitTimeoutMs: settings.waitTimeoutMs,
      now: this.now(),
    });
    // Fail fast: an operator must fix this; the loop keeps probing in the background.
    if (refusal === 'permanent') return Promise.reject(this.failure!.permanent!);
    if (refusal === 'lifetime') {
      // A caller looping with a too large min_ttl would otherwise hammer the provider. Without a
      // min_ttl, the next grant may be longer-lived: point at it (or the floor).
      const retryAfter =
        minRemainingMs > 0
          ? undefined
          : (this.retryAfter() ?? Math.ceil(settings.minRefreshIntervalMs / 1000));
      return Promise.reject(
        lifetimeTooShort(this.client.id, this.lifetime!.ms, minRemainingMs, retryAfter),
      );
    }
    // The fleet backs off (or the floor holds) past this caller's wait: say when, at once.
    if (refusal === 'hold') return Promise.reject(this.unavailable(minRemainingMs));
    const result = new Promise<TokenRecord>((resolve, reject) => {
      const waiter: Waiter = {
        needUntil: this.now() + Math.max(minRemainingMs, MIN_SERVE_MS),
        requestedMs: minRemainingMs,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters?.delete(waiter);
          reject(this.unavailable(minRemainingMs));
        }, settings.waitTimeoutMs),
      };
      (this.waiters ??= new Set()).add(waiter);
    });
    this.ensureRefreshing('demand');
    return result;
  }

  /**
   * `caller`'s call saw the provider refuse the token with `fingerprint`. The refusal costs a
   * token request only within the fleet's rejection floor and the caller's budget; the refused
   * token is still served to `GET /token` until its replacement is in hand.
   */
  async reject(fingerprint: string, caller: string): Promise<RejectionVerdict> {
    const { settings, store, logger } = this.deps;
    const rule: RejectionRule = {
      caller,
      floorMs: settings.minRejectionIntervalMs,
      perCaller: settings.rejectionsPerCaller,
      windowMs: settings.rejectionWindowSeconds * 1000,
    };
    const inStore = store.records.invalidate(this.client.id, fingerprint, rule);
    // The store is down: this replica's own floor and budget, for the token it holds alone.
    const verdict =
      (await this.refresh.orIfStoreFails(inStore, undefined)) ??
      this.rejectLocally(fingerprint, rule);
    if (verdict === 'invalidated' || verdict === 'stale') {
      if (this.held.reject(fingerprint) && verdict === 'invalidated') {
        logger.warn(
          { client: this.client.id, fingerprint, caller },
          'provider rejected the current token; refreshing (the token is still served to GET /token until its replacement is in hand)',
        );
      }
      this.ensureRefreshing('rejected');
    }
    return verdict;
  }

  private rejectLocally(fingerprint: string, rule: RejectionRule): RejectionVerdict {
    const held = this.held.current;
    if (held?.fingerprint !== fingerprint || this.held.isRejected(held)) return 'stale';
    const admitted = (this.localRejections ??= new RejectionLedger(this.now)).admit(
      this.client.id,
      rule,
    );
    return admitted === 'ok' ? 'invalidated' : admitted;
  }

  onStoreEvent(event: TokenStoreEvent): void {
    if (event.type === 'revoked') {
      if (event.fingerprint !== undefined) this.held.refuse(event.fingerprint);
      this.refresh.liftLocalFloor();
      this.syncGeneration();
      return;
    }
    if (event.type === 'invalidated') {
      // Another replica saw the provider refuse it: it is no better here.
      if (this.held.reject(event.fingerprint)) this.ensureRefreshing('invalidated');
      return;
    }
    // Our own token (we wrote it, or already adopted it): nothing to re-read, unless it was
    // refused (the provider may have granted the same token again). Anything else is re-read,
    // and the adoption keeps whichever of the two expires later.
    const cur = this.held.current;
    if (cur !== undefined && event.fingerprint === cur.fingerprint && !this.held.isRejected(cur)) {
      return;
    }
    // A running loop is waiting for exactly this: it re-reads now (asleep: woken; inside a pass:
    // once the pass ends) instead of at its next poll. A pass still waiting for the
    // endpoint has read nothing: the token is adopted now, and the pass then finds it.
    if (this.loop === undefined || this.refresh.waiting) void this.adoptFromStore();
    else if (this.wake) this.wake();
    else this.newsDuringPass = true;
  }

  /** The store is back after an outage; concurrent calls (both connections) share one run. */
  resync(): Promise<void> {
    this.resyncing ??= this.resyncOnce().finally(() => (this.resyncing = undefined));
    return this.resyncing;
  }

  private async resyncOnce(): Promise<void> {
    const held = this.held.current;
    if (!this.held.needsResync && held === undefined) return;
    // A revoke may have been missed while the store was down: serve nothing until the
    // generation is read.
    this.held.setAside();
    try {
      await this.refresh.readShared();
      this.syncGeneration(held);
      if (held && this.held.ofGeneration(held) && held.expiresAt > this.now()) {
        if (this.held.current === undefined) this.adopt(held);
        await this.deps.store.records.writeFenced(this.client.id, held);
      }
      this.held.needsResync = false;
      await this.adoptFromStore();
      this.deps.logger.info({ client: this.client.id }, 'shared store back; token resynchronised');
    } catch (err) {
      // Down again: back to serving what this replica holds, as during any outage.
      this.held.restore(held);
      noteStoreFailure(this.deps.logger, this.client.id, err);
    }
  }

  async forceRefresh(askedAt: number): Promise<Forced> {
    const result = await this.refresh.forced(askedAt, this.deps.settings.waitTimeoutMs);
    this.syncGeneration();
    if (this.held.ofGeneration(result.record)) {
      this.adopt(result.record, result.fetched, true);
      // The fleet's message about this token may have reached this replica first and noted it
      // as adopted: this replica's own request is what happened here.
      this.held.noteRefresh(result.fetched ? 'fetched' : 'adopted', true);
    }
    return result;
  }

  /** The token held once it is of `generation` or later; undefined past `timeoutMs`. */
  async replacementAfter(generation: number, timeoutMs: number): Promise<TokenRecord | undefined> {
    const deadline = this.now() + timeoutMs;
    for (;;) {
      const r = this.held.valid();
      if (r !== undefined && (r.generation ?? 0) >= generation) return r;
      if (this.now() >= deadline) return undefined;
      await sleep(REPLACEMENT_POLL_MS);
    }
  }

  /** `permanent`: an operator must act. */
  private get failure(): Failure | undefined {
    return failureOf(this.phase);
  }

  /** Fingerprints, never tokens; a failure that needs an operator in its full detail. */
  adminStatus() {
    const r = this.held.valid();
    const { state, permanentError, lastError, refreshing } = this.status();
    return {
      state,
      fingerprint: r?.fingerprint,
      expiresAt: r?.expiresAt,
      obtainedAt: r?.obtainedAt,
      generation: this.held.generation,
      lastRefresh: this.held.lastRefresh,
      lastError: permanentError?.message ?? lastError,
      refreshing,
    };
  }

  status() {
    const r = this.held.valid();
    const failure = this.failure;
    return {
      client: this.client.id,
      state: this.lifecycle(),
      hasToken: r !== undefined,
      expiresAt: r?.expiresAt,
      refreshing: this.loop !== undefined,
      // A failure that needs an operator (credentials refused or unreadable).
      permanentError: failure?.permanent
        ? { code: failure.permanent.code, message: failure.permanent.operatorDetail }
        : undefined,
      lastError: failure?.lastError.message,
      failures:
        failure !== undefined
          ? { count: failure.count, result: failure.result ?? 'transient_error' }
          : undefined,
      // Set while the provider's tokens live too short to serve and refresh them.
      lifetimeError: this.lifetime?.problem,
      everObtained: this.held.everObtained,
    };
  }

  private lifecycle() {
    const cur = this.held.current;
    return lifecycleOf({
      expiresAt: cur?.expiresAt,
      everObtained: this.held.everObtained,
      rejected: cur !== undefined && this.held.isRejected(cur),
      revokedPending: cur === undefined && this.held.generation > 0 && this.loop !== undefined,
      refreshing: this.loop !== undefined,
      phase: this.phase,
      now: this.now(),
    });
  }

  /**
   * A token of an older generation (revoked while held) is dropped, never adopted again, and
   * replaced. `held`: a token set aside by {@link resync}, judged too.
   */
  private syncGeneration(held?: TokenRecord): void {
    const generation = this.deps.store.bus.generation(this.client.id);
    if (generation <= this.held.generation) return;
    const dropped = this.held.revoke(generation, held);
    if (dropped !== undefined) {
      this.deps.logger.warn(
        { client: this.client.id, fingerprint: dropped.fingerprint, generation },
        'token revoked fleet-wide; dropped and refreshing',
      );
    }
    const ack = this.deps.store.bus.acknowledgeRevocation(this.client.id, generation);
    void this.refresh.orIfStoreFails(ack, undefined);
    if (this.held.current === undefined) this.ensureRefreshing('revoked');
  }

  private async adoptFromStore(): Promise<void> {
    const r = await this.refresh.orIfStoreFails(this.refresh.readShared(), undefined);
    if (r !== undefined) this.adoptShared(r);
    else this.syncGeneration();
  }

  /** A token another replica stored: held if it may be and outlasts the one held. */
  private adoptShared(r: TokenRecord): void {
    this.syncGeneration();
    if (this.held.mayHold(r) && this.held.outlastedBy(r)) {
      this.adopt(r);
      this.held.noteRefresh('adopted');
    }
  }

  // The refresh loop: one per process, passes until a token is held that meets every waiter.

  private ensureRefreshing(reason: string): void {
    if (this.loop || this.stopped) return;
    this.deps.logger.debug({ client: this.client.id, reason }, 'token refresh started');
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      // A caller may have arrived with a stricter need while the loop was finishing.
      if ((this.waiters?.size ?? 0) > 0 && !this.failure?.permanent)
        this.ensureRefreshing('pending');
    });
  }

  /**
   * Holds `record` (`forced`: whatever the one held) and schedules its refresh. After a fresh
   * fetch (`fetched`), a waiter the new token cannot satisfy (it asked for more than the
   * provider's lifetime) is refused rather than made to trigger another fetch.
   */
  private adopt(record: TokenRecord, fetched = false, forced = false): void {
    const held = this.held.keep(record, forced);
    const lifetimeMs = held.expiresAt - held.obtainedAt;
    this.noteLifetime(lifetimeMs);
    clearTimeout(this.refreshTimer);
    const aheadMs = this.deps.settings.refreshAheadSeconds * 1000;
    const at = refreshAt(aheadMs, held.obtainedAt, held.expiresAt, this.spreadPhase);
    // Clamped: a delay over the timer's limit makes setTimeout fire at once (a refresh loop).
    this.refreshTimer = setTimeout(
      () => this.ensureRefreshing('scheduled'),
      Math.min(MAX_TIMER_MS, Math.max(0, at - this.now())),
    );
    this.refreshTimer.unref();
    const servableUntil = this.now() + MIN_SERVE_MS;
    for (const w of this.waiters ?? []) {
      if (meets(held.expiresAt, w.needUntil, servableUntil)) {
        this.settle(w).resolve(held);
      } else if (fetched) {
        // A fresh token that falls short means none could do.
        const retryAfter = this.retryAfter();
        const refusal = lifetimeTooShort(this.client.id, lifetimeMs, w.requestedMs, retryAfter);
        this.settle(w).reject(refusal);
      }
    }
  }

  private settle(w: Waiter): Waiter {
    clearTimeout(w.timer);
    this.waiters?.delete(w);
    return w;
  }

  private rejectWaiters(err: Error | ((requestedMs: number) => Error)): void {
    for (const w of this.waiters ?? []) {
      this.settle(w).reject(typeof err === 'function' ? err(w.requestedMs) : err);
    }
  }

  private async runLoop(): Promise<void> {
    const { held, now } = this;
    const aheadMs = this.deps.settings.refreshAheadSeconds * 1000;
    this.holderWaits = 0;
    while (!this.stopped) {
      let next: number | 'done';
      this.newsDuringPass = false;
      try {
        const pass = await inSpan('token.refresh', { 'token_broker.client': this.client.id }, () =>
          this.refresh.run({
            held: () => held.current,
            // Judged by the token alone, not "is it the one we hold": another path may have
            // adopted the fleet's new token meanwhile, and the pass must then stop instead of
            // fetching one more.
            goodEnough: (r) => {
              const servableUntil = now() + MIN_SERVE_MS;
              if (held.isRejected(r) || isDue(aheadMs, r, this.spreadPhase, now())) return false;
              for (const w of this.waiters ?? []) {
                if (!meets(r.expiresAt, w.needUntil, servableUntil)) return false;
              }
              return true;
            },
            urgent: () => (this.waiters?.size ?? 0) > 0,
            failed: (err) => this.failed(err),
          }),
        );
        // The pass read the store: a revoke it learnt of drops what it must.
        this.syncGeneration();
        next = this.afterPass(pass);
      } catch (err) {
        next = this.failed(err);
        this.hold(next);
      }
      if (next === 'done' || this.stopped) return;
      this.nextAttemptAt = now() + next;
      await this.sleep(next);
    }
  }

  private afterPass(pass: RefreshPass): number | 'done' {
    if (pass.kind === 'token') {
      const { held } = this;
      // Requested before a revoke that arrived meanwhile, or refused by the provider after the
      // pass judged it (adopting it would hand the rejected token straight back to the caller
      // retrying after its 401): the next pass asks again.
      if (!held.mayHold(pass.record)) return 0;
      if (pass.fetched && held.reissued(pass.record)) {
        this.deps.logger.warn(
          { client: this.client.id, fingerprint: pass.record.fingerprint },
          'the provider granted again the token it had refused (or an operator revoked): serving it; if it must not be used, revoke it at the provider',
        );
      }
      if (pass.unshared) held.needsResync = true;
      this.adopt(pass.record, pass.fetched);
      held.noteRefresh(pass.fetched ? 'fetched' : 'adopted');
      this.phase = SETTLED;
      this.nextAttemptAt = undefined;
      return 'done';
    }
    if (pass.kind === 'wait') return holderWaitMs(this.holderWaits++, this.newsDuringPass);
    // A floor's lifetime tells this replica what the provider grants, even if it was unusable.
    if ('lifetimeMs' in pass && pass.lifetimeMs !== undefined) this.noteLifetime(pass.lifetimeMs);
    this.hold(pass.retryInMs, pass.kind === 'floor' || pass.kind === 'unusable');
    // When a hold ends the replicas race for the lock again: the losers look again soon.
    this.holderWaits = 0;
    return pass.retryInMs;
  }

  /** The loop's sleep; news that arrives during a pass is kept, so it never sleeps on it. */
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

  /**
   * Says once per transition (log and readiness) when it is too short, and when no longer; and
   * once per transition (log) when the refresh lead is more than half of it.
   */
  private noteLifetime(lifetimeMs: number): void {
    const { settings, logger } = this.deps;
    const { minRefreshIntervalMs, refreshAheadSeconds } = settings;
    const id = this.client.id;
    const noted = noteLifetime(this.lifetime, lifetimeMs, settings, (ms) =>
      lifetimeProblem(id, ms, minRefreshIntervalMs),
    );
    this.lifetime = noted.lifetime;
    if (noted.leadCapped === 'on') {
      const half = Math.round(lifetimeMs / 2000);
      logger.warn(
        { client: id, lifetimeMs, refreshAheadSeconds },
        `client "${id}": TOKEN_REFRESH_AHEAD_SECONDS (token.refreshAheadSeconds, ${refreshAheadSeconds} s) is more than half the provider's token lifetime (${Math.round(lifetimeMs / 1000)} s), so the broker refreshes at half the lifetime instead: a provider request every ${half} s or sooner, two or more per lifetime. Set it well below ${half} s`,
      );
    } else if (noted.leadCapped === 'off') {
      logger.info(
        { client: id, lifetimeMs, refreshAheadSeconds },
        'TOKEN_REFRESH_AHEAD_SECONDS fits the provider token lifetime again',
      );
    }
    if (noted.problem === 'on') {
      logger.error({ client: id, lifetimeMs, minRefreshIntervalMs }, noted.lifetime.problem);
    } else if (noted.problem === 'off') {
      logger.info({ client: id, lifetimeMs }, "the provider's token lifetime is long enough again");
    }
  }

  /** Records a failed attempt; returns how long to wait before the next pass. */
  private failed(err: unknown): number {
    const { settings } = this.deps;
    this.held.noteRefresh('failed');
    const servingUntil = this.held.valid()?.expiresAt;
    const lastError = err instanceof Error ? err : new Error(String(err));
    const attempt = (this.failure?.count ?? 0) + 1;
    const { permanent, result, delayMs } = judgeFailure(err, {
      client: this.client,
      attempt,
      backoffBaseMs: settings.backoffBaseMs,
      backoffMaxMs: settings.backoffMaxMs,
      now: this.now(),
      servingUntil,
      random: this.random,
    });
    this.deps.metrics.refreshes.labels(result).inc();
    this.phase = afterFailure(this.phase, lastError, permanent, result);
    this.deps.logger[permanent ? 'error' : 'warn'](
      {
        client: this.client.id,
        attempt,
        code: (err as { code?: string }).code,
        err: lastError.message,
        servingUntil: servingUntil !== undefined ? new Date(servingUntil).toISOString() : undefined,
      },
      permanent
        ? `token refresh failed permanently: ${permanent.operatorDetail}`
        : 'token refresh failed; will retry',
    );
    if (permanent) this.rejectWaiters(permanent);
    return delayMs;
  }

  /** Waiters who cannot outwait `delayMs` are refused at once, with the real `Retry-After`. */
  private hold(delayMs: number, floor = false): void {
    this.nextAttemptAt = this.now() + delayMs;
    this.phase = holding(this.phase, this.nextAttemptAt, floor);
    if (delayMs > this.deps.settings.waitTimeoutMs) {
      this.rejectWaiters((requestedMs) => this.unavailable(requestedMs));
    }
  }

  /** Undefined: no attempt planned. */
  private retryAfter(): number | undefined {
    const now = this.now();
    return this.nextAttemptAt !== undefined && this.nextAttemptAt > now
      ? retryAfterSeconds(this.nextAttemptAt - now)
      : undefined;
  }

  /** `requestedMs`: the caller's min_ttl, 0 when it sent none. */
  private unavailable(requestedMs = 0): TokenException {
    const failure = this.failure;
    if (failure?.permanent) return failure.permanent;
    if (this.lifetime?.problem !== undefined) {
      return new TokenException(TokenErrorCode.Unavailable, this.lifetime.problem, {
        retryAfterSeconds: this.retryAfter() ?? 1,
      });
    }
    const now = this.now();
    const retryAfterMs = (this.nextAttemptAt ?? now) - now;
    if (this.phase.kind === 'floor' && retryAfterMs > 0) {
      return refreshFloorHeld({
        clientId: this.client.id,
        requestedMs,
        minRefreshIntervalMs: this.deps.settings.minRefreshIntervalMs,
        retryAfterMs,
      });
    }
    return unavailableError({
      clientId: this.client.id,
      lastError: failure?.lastError,
      nextAttemptAt: this.nextAttemptAt,
      now,
    });
  }
}

function shuttingDown(): TokenException {
  return new TokenException(TokenErrorCode.ShuttingDown, 'the broker is shutting down', {
    retryAfterSeconds: 1,
  });
}
