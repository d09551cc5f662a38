import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

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

export interface SecretsExceptionOptions extends BrokerExceptionOptions {
  /** The secret id or file path: a reference, never a value. */
  source: string;
}

/**
 * A secret could not be read. `source` names the secret id or file path (a reference, never
 * a value) so the message tells an operator exactly what to check.
 */
export class SecretsException extends BrokerException<SecretsErrorCode> {
  /** The secret id or file path that could not be read. */
  readonly source: string;

  constructor(code: SecretsErrorCode, message: string, options: SecretsExceptionOptions) {
    super(code, message, options);
    this.source = options.source;
  }

  /** Whether a later attempt may succeed without anyone changing anything. */
  get transient(): boolean {
    return this.code === SecretsErrorCode.Unavailable;
  }
}
