import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { TokenSettings } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import { inSpan } from '../tracing/spans';
import type { FleetRefresh, RefreshPass } from './fleet-refresh';
import type { HeldToken } from './held-token';
import {
  afterFailure,
  type Failure,
  failureOf,
  holding,
  judgeFailure,
  lifetimeProblem,
  lifetimeTooShort,
  type RefreshPhase,
  refreshFloorHeld,
  SETTLED,
  unavailableError,
} from './refresh-failure';
import {
  clientPhase,
  isDue,
  leadCappedByLifetime,
  MAX_TIMER_MS,
  MIN_SERVE_MS,
  neededLifetimeMs,
  refreshAt,
  retryAfterSeconds,
} from './refresh-schedule';
import type { TokenRecord } from './token-record';
import { TokenWaiters } from './token-waiters';
import { TokenErrorCode, TokenException } from './token.exception';

interface RefreshLoopDeps {
  refresh: FleetRefresh;
  held: HeldToken;
  metrics: Pick<MetricsService, 'refreshes'>;
  logger: Logger;
  settings: TokenSettings;
  now: () => number;
  random: () => number;
  syncGeneration: () => void;
}

/**
 * The single flight of one client's refresh (at most one loop per process) and where it stands.
 * Waiters are refused as soon as no token can reach them in time.
 */
export class RefreshLoop {
  private readonly waiters = new TokenWaiters();
  private loop?: Promise<void>;
  private refreshTimer?: NodeJS.Timeout;
  /** Ends the loop's sleep early: a store event or shutdown. */
  private wake?: () => void;
  /** News that arrived during a pass, which may have read the store before it: look again. */
  private newsDuringPass = false;
  /** Passes in a row that found the lock held elsewhere: the next short wait doubles. */
  private holderWaits = 0;
  private stopped = false;
  private phase: RefreshPhase = SETTLED;
  /** A hold's end, or a short wait for another replica. */
  private nextAttemptAt?: number;
  /** What a refresh can offer a caller at most; `problem` while too short to serve and refresh. */
  private lifetime?: { ms: number; problem?: string; leadCapped?: boolean };

  /** Where in the refresh window this client refreshes, the same on every replica. */
  private readonly spreadPhase: number;

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: RefreshLoopDeps,
  ) {
    this.spreadPhase = clientPhase(client.id);
  }

  get running(): boolean {
    return this.loop !== undefined;
  }

  /** `permanent`: an operator must act. */
  get failure(): Failure | undefined {
    return failureOf(this.phase);
  }

  get lifetimeError(): string | undefined {
    return this.lifetime?.problem;
  }

  ensureRefreshing(reason: string): void {
    if (this.loop || this.stopped) return;
    this.deps.logger.debug({ client: this.client.id, reason }, 'token refresh started');
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      // A caller may have arrived with a stricter need while the loop was finishing.
      if (this.waiters.size > 0 && !this.failure?.permanent) this.ensureRefreshing('pending');
    });
  }

  /** A store event: re-read now (asleep: woken; inside a pass: once the pass ends). */
  ring(): void {
    if (this.wake) this.wake();
    else this.newsDuringPass = true;
  }

  /** Waiters are failed last, so callers of a refresh in flight at SIGTERM get its token. */
  async stop(timeoutMs: number): Promise<void> {
    this.stopped = true;
    clearTimeout(this.refreshTimer);
    // A loop sleeping between attempts ends now; one inside an attempt finishes it first.
    this.wake?.();
    if (this.loop) await Promise.race([this.loop, sleep(timeoutMs, undefined, { ref: false })]);
    this.waiters.rejectAll(shuttingDown());
  }

  /**
   * Holds `record` (`forced`: whatever the one held) and schedules its refresh. After a fresh
   * fetch (`fetched`), a waiter the new token cannot satisfy (it asked for more than the
   * provider's lifetime) is refused rather than made to trigger another fetch.
   */
  adopt(record: TokenRecord, fetched = false, forced = false): void {
    const held = this.deps.held.keep(record, forced);
    const lifetimeMs = held.expiresAt - held.obtainedAt;
    this.noteLifetime(lifetimeMs);
    clearTimeout(this.refreshTimer);
    const { settings, now } = this.deps;
    const at = refreshAt(
      settings.refreshAheadSeconds * 1000,
      held.obtainedAt,
      held.expiresAt,
      this.spreadPhase,
    );
    // Clamped: a delay over the timer's limit makes setTimeout fire at once (a refresh loop).
    this.refreshTimer = setTimeout(
      () => this.ensureRefreshing('scheduled'),
      Math.min(MAX_TIMER_MS, Math.max(0, at - now())),
    );
    this.refreshTimer.unref();
    this.waiters.offer(
      held,
      fetched
        ? (requestedMs) =>
            lifetimeTooShort(this.client.id, lifetimeMs, requestedMs, this.retryAfter())
        : undefined,
      now() + MIN_SERVE_MS,
    );
  }

  private async runLoop(): Promise<void> {
    const { held, now, settings } = this.deps;
    const aheadMs = settings.refreshAheadSeconds * 1000;
    this.holderWaits = 0;
    while (!this.stopped) {
      let next: number | 'done';
      this.newsDuringPass = false;
      try {
        const pass = await inSpan('token.refresh', { 'token_broker.client': this.client.id }, () =>
          this.deps.refresh.run({
            held: () => held.current,
            // Judged by the token alone, not "is it the one we hold": another path may have
            // adopted the fleet's new token meanwhile, and the pass must then stop instead of
            // fetching one more.
            goodEnough: (r) =>
              !held.isRejected(r) &&
              !isDue(aheadMs, r.obtainedAt, r.expiresAt, now()) &&
              this.waiters.allMetBy(r, now() + MIN_SERVE_MS),
            failed: (err) => this.failed(err),
          }),
        );
        // The pass read the store: a revoke it learnt of drops what it must.
        this.deps.syncGeneration();
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
      const { held } = this.deps;
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
    if (pass.kind === 'wait') {
      // Another replica holds the lock: wait for its message, or re-read now if it came already.
      return this.newsDuringPass ? 0 : Math.min(100 * 2 ** this.holderWaits++, 1000);
    }
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
   * A caller who found no servable token waits for the refresh this starts, or is refused at once
   * when no token can reach it in time.
   */
  waitFor(minRemainingMs: number): Promise<TokenRecord> {
    if (this.stopped) throw shuttingDown();
    // Fail fast: an operator must fix this; the loop keeps probing in the background.
    const permanent = this.failure?.permanent;
    if (permanent) throw permanent;
    const { now, settings } = this.deps;
    // Even a brand-new token could not meet this: a caller looping with a too large min_ttl
    // would otherwise hammer the provider.
    const needMs = Math.max(minRemainingMs, MIN_SERVE_MS);
    if (this.lifetime !== undefined && needMs >= this.lifetime.ms) {
      // Without a min_ttl, the next grant may be longer-lived: point at it (or the floor).
      const retryAfter =
        minRemainingMs > 0
          ? undefined
          : (this.retryAfter() ?? Math.ceil(settings.minRefreshIntervalMs / 1000));
      throw lifetimeTooShort(this.client.id, this.lifetime.ms, minRemainingMs, retryAfter);
    }
    // The fleet backs off (or the floor holds) past this caller's wait: say when, at once.
    if ('until' in this.phase && this.phase.until - now() > settings.waitTimeoutMs) {
      throw this.unavailable(minRemainingMs);
    }
    const result = this.waiters.wait(
      now() + needMs,
      settings.waitTimeoutMs,
      () => this.unavailable(minRemainingMs),
      minRemainingMs,
    );
    this.ensureRefreshing('demand');
    return result;
  }

  /**
   * Says once per transition (log and readiness) when it is too short, and when no longer; and
   * once per transition (log) when the refresh lead is more than half of it.
   */
  private noteLifetime(lifetimeMs: number): void {
    const { minRefreshIntervalMs, refreshAheadSeconds } = this.deps.settings;
    const known = this.lifetime?.problem;
    const problem =
      lifetimeMs < neededLifetimeMs(minRefreshIntervalMs)
        ? lifetimeProblem(this.client.id, lifetimeMs, minRefreshIntervalMs)
        : undefined;
    const wasCapped = this.lifetime?.leadCapped ?? false;
    const leadCapped = leadCappedByLifetime(refreshAheadSeconds * 1000, lifetimeMs);
    this.lifetime = { ms: lifetimeMs, problem, leadCapped };
    if (leadCapped && !wasCapped) {
      const half = Math.round(lifetimeMs / 2000);
      this.deps.logger.warn(
        { client: this.client.id, lifetimeMs, refreshAheadSeconds },
        `client "${this.client.id}": TOKEN_REFRESH_AHEAD_SECONDS (token.refreshAheadSeconds, ${refreshAheadSeconds} s) is more than half the provider's token lifetime (${Math.round(lifetimeMs / 1000)} s), so the broker refreshes at half the lifetime instead: a provider request every ${half} s or sooner, two or more per lifetime. Set it well below ${half} s`,
      );
    } else if (!leadCapped && wasCapped) {
      this.deps.logger.info(
        { client: this.client.id, lifetimeMs, refreshAheadSeconds },
        'TOKEN_REFRESH_AHEAD_SECONDS fits the provider token lifetime again',
      );
    }
    if (problem !== undefined && known === undefined) {
      this.deps.logger.error({ client: this.client.id, lifetimeMs, minRefreshIntervalMs }, problem);
    } else if (problem === undefined && known !== undefined) {
      this.deps.logger.info(
        { client: this.client.id, lifetimeMs },
        "the provider's token lifetime is long enough again",
      );
    }
  }

  /** Records a failed attempt; returns how long to wait before the next pass. */
  private failed(err: unknown): number {
    const { held, settings, now } = this.deps;
    held.noteRefresh('failed');
    const servingUntil = held.valid()?.expiresAt;
    const lastError = err instanceof Error ? err : new Error(String(err));
    const attempt = (this.failure?.count ?? 0) + 1;
    const { permanent, result, delayMs } = judgeFailure(err, {
      client: this.client,
      attempt,
      backoffBaseMs: settings.backoffBaseMs,
      backoffMaxMs: settings.backoffMaxMs,
      now: now(),
      servingUntil,
      random: this.deps.random,
    });
    this.deps.metrics.refreshes.labels(this.client.id, result).inc();
    this.phase = afterFailure(this.phase, lastError, permanent);
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
    if (permanent) this.waiters.rejectAll(permanent);
    return delayMs;
  }

  /** Waiters who cannot outwait `delayMs` are refused at once, with the real `Retry-After`. */
  private hold(delayMs: number, floor = false): void {
    this.nextAttemptAt = this.deps.now() + delayMs;
    this.phase = holding(this.phase, this.nextAttemptAt, floor);
    if (delayMs > this.deps.settings.waitTimeoutMs) {
      this.waiters.rejectAll((requestedMs) => this.unavailable(requestedMs));
    }
  }

  /** Undefined: no attempt planned. */
  private retryAfter(): number | undefined {
    const now = this.deps.now();
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
    const now = this.deps.now();
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
