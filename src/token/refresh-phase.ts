import type { TokenException } from './token.exception';

/** The failed passes since the last token; `permanent` when an operator must act. */
export interface Failure {
  /** Failed passes in a row (the backoff's attempt number). */
  count: number;
  lastError: Error;
  /** Credentials refused or unreadable: callers fail fast until a token is obtained. */
  permanent?: TokenException;
}

/**
 * Where a client's refresh stands since its last token. Each kind carries exactly what it
 * needs: a hold always has its end, a permanent error always comes with its failure.
 * - `settled`: a token was obtained (or none was asked yet), nothing failed since;
 * - `failing`: a pass failed, and no hold was set since;
 * - `backoff`: no provider request before `until` (a failure, or the fleet's deferral);
 * - `floor`: no provider request before `until` (a token was granted less than the floor ago).
 */
export type RefreshPhase =
  | { kind: 'settled' }
  | { kind: 'failing'; failure: Failure }
  | { kind: 'backoff' | 'floor'; until: number; failure?: Failure };

export const SETTLED: RefreshPhase = { kind: 'settled' };

/** The failure the phase carries, if any. */
export function failureOf(phase: RefreshPhase): Failure | undefined {
  return phase.kind === 'settled' ? undefined : phase.failure;
}

/**
 * One more failed pass: a hold already set stays (the caller sets the next one), and a
 * permanent error stays until a token is obtained, even through transient failures after it.
 */
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

/** A hold until `until`: the refresh floor, or the backoff; the failures so far are kept. */
export function holding(phase: RefreshPhase, until: number, floor: boolean): RefreshPhase {
  return { kind: floor ? 'floor' : 'backoff', until, failure: failureOf(phase) };
}
