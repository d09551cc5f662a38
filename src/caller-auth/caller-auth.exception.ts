export enum CallerAuthErrorCode {
  /** No credential, a malformed one, or one that does not verify. */
  Unauthenticated = 'unauthenticated',
  /** A valid caller asking for a client it may not use. */
  Forbidden = 'forbidden',
  /** The credential cannot be checked right now (the cluster's signing keys are unreachable). */
  Unavailable = 'caller_auth_unavailable',
}

export class CallerAuthException extends Error {
  constructor(
    readonly code: CallerAuthErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'CallerAuthException';
  }
}
