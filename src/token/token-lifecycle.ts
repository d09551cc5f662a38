/**
 * One client's token lifecycle as data and pure transitions; `ClientTokenManager` is the only
 * place that holds this state and applies them (with the timers, the store and the provider).
 * Times are epoch milliseconds.
 */
import type { RefreshResult } from '../metrics/metrics.service';
import type { TokenException } from './token.exception';
import { leadCappedByLifetime, MIN_SERVE_MS, neededLifetimeMs } from './refresh-schedule';

export interface Failure {
  /** The backoff's attempt number. */
  count: number;
  lastError: Error;
  /** Callers fail fast until a token is obtained. */
  permanent?: TokenException;
  /** How the last attempt failed, as the metrics name it. */
  result?: RefreshResult;
}

/** Where the refresh stands; each kind carries what it needs (a hold its end). */
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
  result?: RefreshResult,
): RefreshPhase {
  const before = failureOf(phase);
  const failure: Failure = {
    count: (before?.count ?? 0) + 1,
    lastError,
    permanent: permanent ?? before?.permanent,
    ...(result !== undefined && { result }),
  };
  return phase.kind === 'backoff' || phase.kind === 'floor'
    ? { ...phase, failure }
    : { kind: 'failing', failure };
}

export function holding(phase: RefreshPhase, until: number, floor: boolean): RefreshPhase {
  return { kind: floor ? 'floor' : 'backoff', until, failure: failureOf(phase) };
}

/**
 * The client's state as an operator names it, derived from what the manager holds:
 * `empty` (never held one), `fresh` (held, not due), `refreshing`, `backing_off` (a failure's
 * backoff or the refresh floor), `rejected` (the provider refused the held token, its replacement
 * is on its way), `revoked` (dropped fleet-wide, replacement on its way), `expired`, `failed`
 * (an operator must act: credentials refused or unreadable).
 */
export type Lifecycle =
  | 'empty'
  | 'fresh'
  | 'refreshing'
  | 'backing_off'
  | 'rejected'
  | 'revoked'
  | 'expired'
  | 'failed';

export interface LifecycleFacts {
  /** Expiry of the token held, if any. */
  expiresAt?: number;
  everObtained: boolean;
  /** The held token was refused by the provider. */
  rejected: boolean;
  /** A revoke dropped the held token and none replaced it yet. */
  revokedPending: boolean;
  refreshing: boolean;
  phase: RefreshPhase;
  now: number;
}

export function lifecycleOf(f: LifecycleFacts): Lifecycle {
  if (failureOf(f.phase)?.permanent) return 'failed';
  if (f.expiresAt === undefined) {
    if (f.revokedPending) return 'revoked';
    return f.everObtained ? 'expired' : 'empty';
  }
  if (f.expiresAt <= f.now) return 'expired';
  if (f.rejected) return 'rejected';
  if (f.phase.kind === 'backoff' || f.phase.kind === 'floor') return 'backing_off';
  return f.refreshing ? 'refreshing' : 'fresh';
}

/** Another replica holds the lock: wait for its message (news: re-read now), doubling to 1 s. */
export function holderWaitMs(waitsInARow: number, newsDuringPass: boolean): number {
  return newsDuringPass ? 0 : Math.min(100 * 2 ** waitsInARow, 1000);
}

/** What a refresh can offer a caller at most; `problem` while too short to serve and refresh. */
export interface Lifetime {
  ms: number;
  problem?: string;
  leadCapped: boolean;
}

/** `on`/`off`: the condition started or ended with this lifetime, to say once per transition. */
export type Change = 'on' | 'off' | undefined;

export function noteLifetime(
  before: Lifetime | undefined,
  lifetimeMs: number,
  settings: { minRefreshIntervalMs: number; refreshAheadSeconds: number },
  problemOf: (lifetimeMs: number) => string,
): { lifetime: Lifetime; leadCapped: Change; problem: Change } {
  const problem =
    lifetimeMs < neededLifetimeMs(settings.minRefreshIntervalMs)
      ? problemOf(lifetimeMs)
      : undefined;
  const leadCapped = leadCappedByLifetime(settings.refreshAheadSeconds * 1000, lifetimeMs);
  return {
    lifetime: { ms: lifetimeMs, problem, leadCapped },
    leadCapped: change(before?.leadCapped ?? false, leadCapped),
    problem: change(before?.problem !== undefined, problem !== undefined),
  };
}

function change(was: boolean, is: boolean): Change {
  return was === is ? undefined : is ? 'on' : 'off';
}

/**
 * Why a caller without a servable token is refused at once instead of waiting: an operator must
 * act, even a brand-new token could not meet it, or the fleet holds past the caller's wait.
 */
export type Refusal = 'permanent' | 'lifetime' | 'hold' | undefined;

export function refusalOf(opts: {
  phase: RefreshPhase;
  lifetimeMs?: number;
  minRemainingMs: number;
  waitTimeoutMs: number;
  now: number;
}): Refusal {
  if (failureOf(opts.phase)?.permanent) return 'permanent';
  const needMs = Math.max(opts.minRemainingMs, MIN_SERVE_MS);
  if (opts.lifetimeMs !== undefined && needMs >= opts.lifetimeMs) return 'lifetime';
  const { phase } = opts;
  if ('until' in phase && phase.until - opts.now > opts.waitTimeoutMs) return 'hold';
  return undefined;
}

/** A waiting caller's need: met by a token lasting until then and servable beyond the minimum. */
export function meets(expiresAt: number, needUntil: number, servableUntil: number): boolean {
  return expiresAt >= Math.max(needUntil, servableUntil);
}
