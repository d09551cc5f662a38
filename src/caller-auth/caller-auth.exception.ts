import {
  BrokerException,
  type BrokerExceptionOptions,
  type ProblemStatus,
  type ProblemTable,
} from '../errors/broker.exception';

export enum CallerAuthErrorCode {
  Unauthenticated = 'unauthenticated',
  Forbidden = 'forbidden',
  /** The cluster's signing keys are unreachable. */
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

export class CallerAuthException extends BrokerException<CallerAuthErrorCode> {
  /** For a client outside the grant: `client` when configured, else `reason: 'unknown_client'`. */
  readonly audit: { readonly client?: string; readonly reason?: string };

  constructor(
    code: CallerAuthErrorCode,
    message: string,
    options: BrokerExceptionOptions & Partial<Pick<CallerAuthException, 'audit'>> = {},
  ) {
    super(code, message, options);
    this.audit = options.audit ?? {};
  }

  override get problemStatus(): ProblemStatus {
    return CALLER_AUTH_PROBLEMS[this.code];
  }
}
