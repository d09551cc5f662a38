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
import { MIN_SERVE_MS, neededLifetimeMs } from './refresh-schedule';
import type { TokenWaiters } from './token-waiters';
import { TokenErrorCode, TokenException } from './token.exception';

export interface Failure {
  /** The backoff's attempt number. */
  count: number;
  lastError: Error;
  /** Callers fail fast until a token is obtained. */
  permanent?: TokenException;
}

/** Each kind carries what it needs: a hold has its end, a permanent error its failure. */
export type RefreshPhase =
  | { kind: 'settled' }
  | { kind: 'failing'; failure: Failure }
  | { kind: 'backoff' | 'floor'; until: number; failure?: Failure };

export const SETTLED: RefreshPhase = { kind: 'settled' };

export function failureOf(phase: RefreshPhase): Failure | undefined {
  return phase.kind === 'settled' ? undefined : phase.failure;
}

/** A hold already set stays, and a permanent error stays until a token is obtained. */
export function afterFailure(
  phase: RefreshPhase,
  lastError: Error,
  permanent?: TokenException,
): RefreshPhase {
  const before = failureOf(phase);
  const failure: Failure = {
    count: (before?.count ?? 0) + 1,
    lastError,
    permanent: permanent ?? before?.permanent,
  };
  return phase.kind === 'backoff' || phase.kind === 'floor'
    ? { ...phase, failure }
    : { kind: 'failing', failure };
}

export function holding(phase: RefreshPhase, until: number, floor: boolean): RefreshPhase {
  return { kind: floor ? 'floor' : 'backoff', until, failure: failureOf(phase) };
}

interface StandingDeps {
  metrics: Pick<MetricsService, 'refreshes'>;
  logger: Logger;
  settings: TokenSettings;
  now: () => number;
  random: () => number;
}

/**
 * Where one client's refresh stands (failures, holds, the provider's lifetime), and what a caller
 * is told meanwhile: waiters are refused as soon as no token can reach them in time.
 */
export class RefreshStanding {
  private phase: RefreshPhase = SETTLED;
  /** A hold's end, or a short wait for another replica. */
  nextAttemptAt?: number;
  /** What a refresh can offer a caller at most; `problem` while too short to serve and refresh. */
  private lifetime?: { ms: number; problem?: string };

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: StandingDeps,
    private readonly waiters: TokenWaiters,
  ) {}

  /** `permanent`: an operator must act. */
  get failure(): Failure | undefined {
    return failureOf(this.phase);
  }

  get lifetimeError(): string | undefined {
    return this.lifetime?.problem;
  }

  settle(): void {
    this.phase = SETTLED;
    this.nextAttemptAt = undefined;
  }

  refuseBeforeWaiting(minRemainingMs: number, waitTimeoutMs: number): void {
    // Fail fast: an operator must fix this; the loop keeps probing in the background.
    const permanent = this.failure?.permanent;
    if (permanent) throw permanent;
    // Even a brand-new token could not meet this: a caller looping with a too large min_ttl
    // would otherwise hammer the provider.
    const needMs = Math.max(minRemainingMs, MIN_SERVE_MS);
    if (this.lifetime !== undefined && needMs >= this.lifetime.ms) {
      // Without a min_ttl, the next grant may be longer-lived: point at it (or the floor).
      const retryAfter =
        minRemainingMs > 0
          ? undefined
          : (this.retryAfter() ?? Math.ceil(this.deps.settings.minRefreshIntervalMs / 1000));
      throw lifetimeTooShort(this.client.id, this.lifetime.ms, minRemainingMs, retryAfter);
    }
    // The fleet backs off (or the floor holds) past this caller's wait: say when, at once.
    if ('until' in this.phase && this.phase.until - this.deps.now() > waitTimeoutMs) {
      throw this.unavailable(minRemainingMs);
    }
  }

  /** Says once per transition (log and readiness) when it is too short, and when no longer. */
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

  /** Returns how long to wait before the next pass. */
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

  /** Waiters who cannot outwait `delayMs` are refused at once, with the real `Retry-After`. */
  hold(delayMs: number, floor = false): void {
    this.nextAttemptAt = this.deps.now() + delayMs;
    this.phase = holding(this.phase, this.nextAttemptAt, floor);
    if (delayMs > this.deps.settings.waitTimeoutMs) {
      this.waiters.rejectAll((requestedMs) => this.unavailable(requestedMs));
    }
  }

  /** Undefined: no attempt planned. */
  retryAfter(): number | undefined {
    const now = this.deps.now();
    return this.nextAttemptAt !== undefined && this.nextAttemptAt > now
      ? Math.max(1, Math.ceil((this.nextAttemptAt - now) / 1000))
      : undefined;
  }

  /** `requestedMs`: the caller's min_ttl, 0 when it sent none. */
  unavailable(requestedMs = 0): TokenException {
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
