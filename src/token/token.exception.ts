import {
  BrokerException,
  type BrokerExceptionOptions,
  type ProblemStatus,
  type ProblemTable,
} from '../errors/broker.exception';

/** Stable: callers and dashboards key on these. */
export enum TokenErrorCode {
  UnknownClient = 'unknown_client',
  ClientRequired = 'client_required',
  Unavailable = 'token_unavailable',
  /** Even after re-reading them. */
  CredentialsRejected = 'credentials_rejected',
  CredentialsUnavailable = 'credentials_unavailable',
  ShuttingDown = 'shutting_down',
  /** RFC 9449: the client's tokens work only with the broker's proof key. */
  DpopBound = 'dpop_bound_token',
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
  [TokenErrorCode.DpopBound]: { status: 403, title: 'DPoP-bound token' },
};

interface TokenExceptionOptions extends BrokerExceptionOptions {
  /**
   * Names the secret or file the credentials come from: logged and shown on the admin listener,
   * never answered to a caller (an ARN names the AWS account, a path maps the pod).
   */
  operatorDetail?: string;
}

export class TokenException extends BrokerException<TokenErrorCode> {
  readonly operatorDetail: string;

  constructor(code: TokenErrorCode, message: string, options: TokenExceptionOptions = {}) {
    super(code, message, options);
    this.operatorDetail = options.operatorDetail ?? message;
  }

  override get problemStatus(): ProblemStatus {
    return TOKEN_PROBLEMS[this.code];
  }
}
