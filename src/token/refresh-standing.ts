import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { TokenSettings } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import {
  judgeFailure,
  lifetimeProblem,
  lifetimeTooShort,
  refreshFloorHeld,
  unavailableError,
} from './refresh-failure';
import {
  afterFailure,
  type Failure,
  failureOf,
  holding,
  type RefreshPhase,
  SETTLED,
} from './refresh-phase';
import { MIN_SERVE_MS, neededLifetimeMs } from './refresh-schedule';
import type { TokenWaiters } from './token-waiters';
import { TokenErrorCode, TokenException } from './token.exception';

/** Collaborators of a {@link RefreshStanding}; the manager's own. */
export interface StandingDeps {
  metrics: Pick<MetricsService, 'refreshes'>;
  logger: Logger;
  settings: TokenSettings;
  now: () => number;
  random: () => number;
}

/**
 * Where one client's refresh stands, and what a caller is told while no token can be had:
 * the failures and holds since the last token (see {@link RefreshPhase}), when the next
 * attempt is due, and the provider's token lifetime. Callers waiting in {@link TokenWaiters}
 * are refused as soon as no token can reach them in time.
 */
export class RefreshStanding {
  /** Failures and holds since the last token. */
  private phase: RefreshPhase = SETTLED;
  /** When the loop's next pass is due (a hold's end, or a short wait for another replica). */
  nextAttemptAt?: number;
  /**
   * Lifetime of the newest token obtained (ms): what a refresh can offer a caller at most;
   * `problem` while it is too short to serve and refresh (see {@link noteLifetime}).
   */
  private lifetime?: { ms: number; problem?: string };

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: StandingDeps,
    private readonly waiters: TokenWaiters,
  ) {}

  /** The failure since the last token, if any (`permanent`: an operator must act). */
  get failure(): Failure | undefined {
    return failureOf(this.phase);
  }

  /** Why the provider's tokens are too short-lived to serve and refresh, while they are. */
  get lifetimeError(): string | undefined {
    return this.lifetime?.problem;
  }

  /** A token was obtained: nothing failed, nothing held. */
  settle(): void {
    this.phase = SETTLED;
    this.nextAttemptAt = undefined;
  }

  /**
   * Throws when a caller needing `minRemainingMs` must be refused before it waits: a
   * permanent failure, a lifetime no token can meet, or a hold outlasting `waitTimeoutMs`.
   */
  refuseBeforeWaiting(minRemainingMs: number, waitTimeoutMs: number): void {
    // Fail fast: an operator must fix this; the loop keeps probing in the background.
    const permanent = this.failure?.permanent;
    if (permanent) throw permanent;
    // Even a brand-new token could not meet this: refuse now instead of fetching one per
    // such request (a caller looping with a too large min_ttl would hammer the provider).
    const needMs = Math.max(minRemainingMs, MIN_SERVE_MS);
    if (this.lifetime !== undefined && needMs >= this.lifetime.ms) {
      // Without a min_ttl, the next grant may be longer-lived: point at it (or the floor).
      const retryAfter =
        minRemainingMs > 0
          ? undefined
          : (this.retryAfter() ?? Math.ceil(this.deps.settings.minRefreshIntervalMs / 1000));
      throw lifetimeTooShort(this.client.id, this.lifetime.ms, minRemainingMs, retryAfter);
    }
    // The fleet backs off (or the refresh floor holds) past this caller's wait: no token can
    // come in time, so say at once when the next attempt is instead of holding the caller.
    if ('until' in this.phase && this.phase.until - this.deps.now() > waitTimeoutMs) {
      throw this.unavailable(minRemainingMs);
    }
  }

  /**
   * Records the provider's lifetime; says once per transition (log and readiness) when it
   * is too short to serve and refresh under the floor, and once when it no longer is.
   */
  noteLifetime(lifetimeMs: number): void {
    const { minRefreshIntervalMs } = this.deps.settings;
    const known = this.lifetime?.problem;
    const problem =
      lifetimeMs < neededLifetimeMs(minRefreshIntervalMs)
        ? lifetimeProblem(this.client.id, lifetimeMs, minRefreshIntervalMs)
        : undefined;
    this.lifetime = { ms: lifetimeMs, problem };
    if (problem !== undefined && known === undefined) {
      this.deps.logger.error({ client: this.client.id, lifetimeMs, minRefreshIntervalMs }, problem);
    } else if (problem === undefined && known !== undefined) {
      this.deps.logger.info(
        { client: this.client.id, lifetimeMs },
        "the provider's token lifetime is long enough again",
      );
    }
  }

  /**
   * Records a failed pass and returns how long to wait before the next one. `servingUntil`:
   * the expiry of the valid token still served, if any.
   */
  failed(err: unknown, servingUntil?: number): number {
    const lastError = err instanceof Error ? err : new Error(String(err));
    const attempt = (this.failure?.count ?? 0) + 1;
    const { settings, now } = this.deps;
    const verdict = judgeFailure(err, {
      client: this.client,
      attempt,
      backoffBaseMs: settings.backoffBaseMs,
      backoffMaxMs: settings.backoffMaxMs,
      now: now(),
      servingUntil,
      random: this.deps.random,
    });
    this.deps.metrics.refreshes.labels(this.client.id, verdict.result).inc();
    this.phase = afterFailure(this.phase, lastError, verdict.permanent);
    const logFields = {
      client: this.client.id,
      attempt,
      code: (err as { code?: string }).code,
      err: lastError.message,
      servingUntil: servingUntil !== undefined ? new Date(servingUntil).toISOString() : undefined,
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
  hold(delayMs: number, floor = false): void {
    this.nextAttemptAt = this.deps.now() + delayMs;
    this.phase = holding(this.phase, this.nextAttemptAt, floor);
    if (delayMs > this.deps.settings.waitTimeoutMs) {
      this.waiters.rejectAll((requestedMs) => this.unavailable(requestedMs));
    }
  }

  /** Seconds until the next attempt, for `Retry-After` (undefined: none planned). */
  retryAfter(): number | undefined {
    const now = this.deps.now();
    return this.nextAttemptAt !== undefined && this.nextAttemptAt > now
      ? Math.max(1, Math.ceil((this.nextAttemptAt - now) / 1000))
      : undefined;
  }

  /**
   * The 503 (or permanent failure) for a caller no token can reach in time (`requestedMs`:
   * its min_ttl, 0 when it sent none): a lifetime too short to serve, the refresh floor, or
   * the last failure, whichever holds the token back.
   */
  unavailable(requestedMs = 0): TokenException {
    const failure = this.failure;
    if (failure?.permanent) return failure.permanent;
    if (this.lifetime?.problem !== undefined) {
      return new TokenException(TokenErrorCode.Unavailable, this.lifetime.problem, {
        retryAfterSeconds: this.retryAfter() ?? 1,
      });
    }
    const now = this.deps.now();
    if (
      this.phase.kind === 'floor' &&
      this.nextAttemptAt !== undefined &&
      this.nextAttemptAt > now
    ) {
      return refreshFloorHeld({
        clientId: this.client.id,
        requestedMs,
        minRefreshIntervalMs: this.deps.settings.minRefreshIntervalMs,
        retryAfterMs: this.nextAttemptAt - now,
      });
    }
    return unavailableError({
      clientId: this.client.id,
      permanent: failure?.permanent,
      lastError: failure?.lastError,
      nextAttemptAt: this.nextAttemptAt,
      now,
    });
  }
}
