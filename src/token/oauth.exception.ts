import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

/** RFC 6749 §5.2 (plus RFC 8707's `invalid_target`): stock clients key on these strings. */
export enum OAuthErrorCode {
  InvalidRequest = 'invalid_request',
  InvalidClient = 'invalid_client',
  UnauthorizedClient = 'unauthorized_client',
  UnsupportedGrantType = 'unsupported_grant_type',
  InvalidScope = 'invalid_scope',
  InvalidTarget = 'invalid_target',
  TemporarilyUnavailable = 'temporarily_unavailable',
  ServerError = 'server_error',
}

interface OAuthExceptionOptions extends BrokerExceptionOptions {
  /** `invalid_client` only: the client tried Basic, so the 401 challenges Basic (§5.2). */
  basicChallenge?: boolean;
}

/** Answered as `{error, error_description}`, never as a problem document. */
export class OAuthException extends BrokerException<OAuthErrorCode> {
  readonly basicChallenge: boolean;

  constructor(code: OAuthErrorCode, message: string, options: OAuthExceptionOptions = {}) {
    super(code, message, options);
    this.basicChallenge = options.basicChallenge ?? false;
  }
}
