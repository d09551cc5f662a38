export enum CallerAuthErrorCode {
  /** No credential, a malformed one, or one that does not verify. */
  Unauthenticated = 'unauthenticated',
  /** A valid caller asking for a client it may not use. */
  Forbidden = 'forbidden',
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
