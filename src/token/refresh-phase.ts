import type { TokenException } from './token.exception';

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
