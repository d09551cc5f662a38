import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

/**
 * Why a `/provider/<client>/...` request was not answered with the provider's own response.
 * Stable: callers and dashboards key on these. The idempotency codes it shares with
 * `POST /orders` (`idempotency_key_invalid`, `idempotency_key_reused`, `idempotency_unavailable`,
 * `idempotency_record_tampered`, `idempotency_records_exceeded`) come from `OrdersErrorCode`.
 */
export enum ForwardErrorCode {
  /** 400: the provider path is malformed or tries to escape the allow-list (`..`, `%2f`, `//`, ...). */
  PathInvalid = 'forward_path_invalid',
  /** 403: no allow-list rule of the client lets this method and path pass. */
  NotAllowed = 'forward_not_allowed',
  /** 413: the request body exceeds `forward.bodyLimitBytes`. */
  BodyTooLarge = 'forward_body_too_large',
  /** 409: the first request with this `Idempotency-Key` is still being forwarded. */
  InFlight = 'forward_in_flight',
  /** 409: the first request with this `Idempotency-Key` may or may not have been processed. */
  OutcomeUnknown = 'forward_outcome_unknown',
  /** 429: the client's or the caller's rate limit at the broker (`Retry-After`). */
  RateLimited = 'forward_rate_limited',
  /** 502: the provider rejected a freshly obtained token too. Nothing was processed. */
  TokenRejected = 'forward_token_rejected',
  /** 502: no connection to the provider, or it broke (the detail says whether it was sent). */
  ProviderUnreachable = 'forward_provider_unreachable',
  /** 502: the provider's answer could not be relayed (too large to store, or cut off). */
  ProviderBadResponse = 'forward_provider_bad_response',
  /**
   * 502: the provider's answer contained the access token the broker sent (an echo of the
   * `Authorization` header): withheld, never relayed or stored. It may have been processed.
   */
  UpstreamEchoedToken = 'forward_upstream_echoed_token',
  /** 504: the provider did not answer in time after the request was sent. */
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

/** A passthrough request the broker answers itself. `retryAfterSeconds` feeds `Retry-After`. */
export class ForwardException extends BrokerException<ForwardErrorCode> {
  override get problemStatus(): ProblemStatus {
    return FORWARD_PROBLEMS[this.code];
  }
}
