import {
  BrokerException,
  type BrokerExceptionOptions,
  type ProblemStatus,
  type ProblemTable,
} from '../errors/broker.exception';

/** Why a token could not be handed out. Stable: callers and dashboards key on these. */
export enum TokenErrorCode {
  /** `client` names no configured client. */
  UnknownClient = 'unknown_client',
  /** Several clients are configured and the request did not say which. */
  ClientRequired = 'client_required',
  /** No token with the requested remaining lifetime could be had in time; retry later. */
  Unavailable = 'token_unavailable',
  /** The provider refused the client credentials, even after re-reading them. */
  CredentialsRejected = 'credentials_rejected',
  /** The credentials could not be read (missing secret, no permission, malformed JSON). */
  CredentialsUnavailable = 'credentials_unavailable',
  /** The broker is shutting down. */
  ShuttingDown = 'shutting_down',
}

export const TOKEN_PROBLEMS: ProblemTable<TokenErrorCode> = {
  [TokenErrorCode.ClientRequired]: { status: 400, title: 'Client required' },
  [TokenErrorCode.UnknownClient]: { status: 404, title: 'Unknown client' },
  [TokenErrorCode.Unavailable]: { status: 503, title: 'Token unavailable', retryAfterSeconds: 1 },
  [TokenErrorCode.CredentialsRejected]: {
    status: 503,
    title: 'Provider credentials rejected',
    retryAfterSeconds: 1,
  },
  [TokenErrorCode.CredentialsUnavailable]: {
    status: 503,
    title: 'Provider credentials unavailable',
    retryAfterSeconds: 1,
  },
  [TokenErrorCode.ShuttingDown]: { status: 503, title: 'Shutting down', retryAfterSeconds: 1 },
};

export interface TokenExceptionOptions extends BrokerExceptionOptions {
  /**
   * The message with what only operators may read: the secret or file the credentials come
   * from. Logged and shown on the admin listener (readiness, `/admin/*`), never answered to a
   * caller, since an ARN names the AWS account and a path maps the pod. Default: the message.
   */
  operatorDetail?: string;
}

/** A token request that cannot be served. `retryAfterSeconds` feeds the `Retry-After` header. */
export class TokenException extends BrokerException<TokenErrorCode> {
  /** See {@link TokenExceptionOptions.operatorDetail}. */
  readonly operatorDetail: string;

  constructor(code: TokenErrorCode, message: string, options: TokenExceptionOptions = {}) {
    super(code, message, options);
    this.operatorDetail = options.operatorDetail ?? message;
  }

  override get problemStatus(): ProblemStatus {
    return TOKEN_PROBLEMS[this.code];
  }
}
