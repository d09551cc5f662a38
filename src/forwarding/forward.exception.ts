import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

/**
 * Stable: callers and dashboards key on these. The idempotency codes the passthrough shares
 * with `POST /orders` are `OrdersErrorCode`'s.
 */
export enum ForwardErrorCode {
  PathInvalid = 'forward_path_invalid',
  NotAllowed = 'forward_not_allowed',
  BodyTooLarge = 'forward_body_too_large',
  InFlight = 'forward_in_flight',
  OutcomeUnknown = 'forward_outcome_unknown',
  RateLimited = 'forward_rate_limited',
  TokenRejected = 'forward_token_rejected',
  ProviderUnreachable = 'forward_provider_unreachable',
  ProviderBadResponse = 'forward_provider_bad_response',
  /** Withheld, never relayed or stored; the request may have been processed. */
  UpstreamEchoedToken = 'forward_upstream_echoed_token',
  ProviderTimeout = 'forward_provider_timeout',
}

export const FORWARD_PROBLEMS: ProblemTable<ForwardErrorCode> = {
  [ForwardErrorCode.PathInvalid]: { status: 400, title: 'Invalid provider path' },
  [ForwardErrorCode.NotAllowed]: { status: 403, title: "Not allowed by the client's allow-list" },
  [ForwardErrorCode.InFlight]: { status: 409, title: 'Request in flight' },
  [ForwardErrorCode.OutcomeUnknown]: { status: 409, title: 'Request outcome unknown' },
  [ForwardErrorCode.BodyTooLarge]: { status: 413, title: 'Request body too large' },
  [ForwardErrorCode.RateLimited]: { status: 429, title: 'Rate limited', retryAfterSeconds: 1 },
  [ForwardErrorCode.TokenRejected]: { status: 502, title: 'Provider rejected the token' },
  [ForwardErrorCode.ProviderUnreachable]: { status: 502, title: 'Provider unreachable' },
  [ForwardErrorCode.ProviderBadResponse]: { status: 502, title: 'Bad provider response' },
  [ForwardErrorCode.UpstreamEchoedToken]: {
    status: 502,
    title: 'Provider answer echoed the token',
  },
  [ForwardErrorCode.ProviderTimeout]: { status: 504, title: 'Provider timeout' },
};

export class ForwardException extends BrokerException<ForwardErrorCode> {
  override get problemStatus(): ProblemStatus {
    return FORWARD_PROBLEMS[this.code];
  }
}
