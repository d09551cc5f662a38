import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

/**
 * RFC 6749 §5.2 error codes (plus RFC 8707's `invalid_target`), as `POST /oauth2/token`
 * answers them. Stock OAuth clients key on these strings, so they are the protocol's, not ours.
 */
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

export interface OAuthExceptionOptions extends BrokerExceptionOptions {
  /** `invalid_client` only: the client tried HTTP Basic, so the 401 challenges Basic (§5.2). */
  basicChallenge?: boolean;
}

/**
 * A token-endpoint request refused in the OAuth vocabulary. Only `POST /oauth2/token` throws
 * and answers it (as `{error, error_description}`, never as a problem document).
 */
export class OAuthException extends BrokerException<OAuthErrorCode> {
  readonly basicChallenge: boolean;

  constructor(code: OAuthErrorCode, message: string, options: OAuthExceptionOptions = {}) {
    super(code, message, options);
    this.basicChallenge = options.basicChallenge ?? false;
  }
}
