/** What went wrong reading a secret. */
export enum SecretsErrorCode {
  /** The secret (or file) does not exist. */
  NotFound = 'secret_not_found',
  /** The broker's identity may not read it (IAM policy, KMS key policy, file mode). */
  AccessDenied = 'secret_access_denied',
  /** Secrets Manager did not answer usefully; worth retrying later. */
  Unavailable = 'secret_unavailable',
  /** It was read but does not hold the expected JSON. */
  Malformed = 'secret_malformed',
}

/**
 * A secret could not be read. `source` names the secret id or file path (a reference, never
 * a value) so the message tells an operator exactly what to check.
 */
export class SecretsException extends Error {
  constructor(
    readonly code: SecretsErrorCode,
    readonly source: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'SecretsException';
  }

  /** Whether a later attempt may succeed without anyone changing anything. */
  get transient(): boolean {
    return this.code === SecretsErrorCode.Unavailable;
  }
}
