import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

export enum SecretsErrorCode {
  NotFound = 'secret_not_found',
  /** IAM policy, KMS key policy, file mode. */
  AccessDenied = 'secret_access_denied',
  /** Worth retrying later. */
  Unavailable = 'secret_unavailable',
  /** Read, but not the expected JSON. */
  Malformed = 'secret_malformed',
}

interface SecretsExceptionOptions extends BrokerExceptionOptions {
  /** A reference, never a value. */
  source: string;
}

/** `source` tells an operator exactly what to check. */
export class SecretsException extends BrokerException<SecretsErrorCode> {
  readonly source: string;

  constructor(code: SecretsErrorCode, message: string, options: SecretsExceptionOptions) {
    super(code, message, options);
    this.source = options.source;
  }

  /** Read, but not what it should hold. */
  static malformed(source: string, message: string): SecretsException {
    return new SecretsException(SecretsErrorCode.Malformed, message, { source });
  }

  /** A later attempt may succeed without anyone changing anything. */
  get transient(): boolean {
    return this.code === SecretsErrorCode.Unavailable;
  }
}
