import {
  BrokerException,
  type BrokerExceptionOptions,
  type ProblemStatus,
  type ProblemTable,
} from '../errors/broker.exception';

export enum CallerAuthErrorCode {
  /** No credential, a malformed one, or one that does not verify. */
  Unauthenticated = 'unauthenticated',
  /** A valid caller asking for a client it may not use. */
  Forbidden = 'forbidden',
  /** The credential cannot be checked right now (the cluster's signing keys are unreachable). */
  Unavailable = 'caller_auth_unavailable',
}

export const CALLER_AUTH_PROBLEMS: ProblemTable<CallerAuthErrorCode> = {
  [CallerAuthErrorCode.Unauthenticated]: {
    status: 401,
    title: 'Unauthenticated',
    challenge: 'Bearer realm="token-broker"',
  },
  [CallerAuthErrorCode.Forbidden]: { status: 403, title: 'Forbidden' },
  [CallerAuthErrorCode.Unavailable]: {
    status: 503,
    title: 'Caller verification unavailable',
    retryAfterSeconds: 2,
  },
};

/** A caller that cannot be admitted: unauthenticated, not granted the client, or not checkable now. */
export class CallerAuthException extends BrokerException<CallerAuthErrorCode> {
  /**
   * What the audit line records besides the code, where the answer hides it from the caller:
   * for a client outside the caller's grant, `client` when it is configured, else
   * `reason: 'unknown_client'`.
   */
  readonly audit: { readonly client?: string; readonly reason?: string };

  constructor(
    code: CallerAuthErrorCode,
    message: string,
    options: BrokerExceptionOptions & { audit?: { client?: string; reason?: string } } = {},
  ) {
    const { audit, ...rest } = options;
    super(code, message, rest);
    this.audit = audit ?? {};
  }

  override get problemStatus(): ProblemStatus {
    return CALLER_AUTH_PROBLEMS[this.code];
  }
}
