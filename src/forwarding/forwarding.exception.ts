import {
  BrokerException,
  type BrokerExceptionOptions,
  type ProblemStatus,
  type ProblemTable,
} from '../errors/broker.exception';

/** Stable: callers and dashboards key on these. */
export enum OrdersErrorCode {
  InvalidBody = 'order_body_invalid',
  InvalidIdempotencyKey = 'idempotency_key_invalid',
  InFlight = 'order_in_flight',
  /** Only the provider can tell: reconcile there before creating the order under a new key. */
  OutcomeUnknown = 'order_outcome_unknown',
  BodyTooLarge = 'order_body_too_large',
  UnsupportedMediaType = 'order_unsupported_media_type',
  IdempotencyKeyReused = 'idempotency_key_reused',
  TokenRejected = 'order_token_rejected',
  ProviderUnreachable = 'order_provider_unreachable',
  ProviderBadResponse = 'order_provider_bad_response',
  /** Withheld, never relayed or stored; the order may exist. */
  UpstreamEchoedToken = 'order_upstream_echoed_token',
  /** A duplicate cannot be ruled out without the store. */
  IdempotencyUnavailable = 'idempotency_unavailable',
  /** Changed in Redis by something other than a broker: nothing is replayed or sent. */
  IdempotencyRecordTampered = 'idempotency_record_tampered',
  IdempotencyRecordsExceeded = 'idempotency_records_exceeded',
  IdempotencyBytesExceeded = 'idempotency_bytes_exceeded',
  ProviderTimeout = 'order_provider_timeout',
  RateLimited = 'order_rate_limited',
  /** Too many requests, or too many body bytes, of this caller on this replica. */
  CallerBudgetExceeded = 'order_caller_budget_exceeded',
  /** This replica holds as many request bodies as its memory allows. */
  BodyBudgetExhausted = 'order_body_budget_exhausted',
}

/**
 * Stable too: the passthrough's own. The idempotency codes it shares with `POST /orders` are
 * `OrdersErrorCode`'s.
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
  CallerBudgetExceeded = 'forward_caller_budget_exceeded',
  BodyBudgetExhausted = 'forward_body_budget_exhausted',
}

export type ForwardingErrorCode = OrdersErrorCode | ForwardErrorCode;

/** Both routes' codes in one table: `FAILURE_CODES` says which one a route answers. */
export const FORWARDING_PROBLEMS: ProblemTable<ForwardingErrorCode> = {
  [OrdersErrorCode.InvalidBody]: { status: 400, title: 'Invalid order body' },
  [OrdersErrorCode.InvalidIdempotencyKey]: { status: 400, title: 'Invalid Idempotency-Key' },
  [OrdersErrorCode.InFlight]: { status: 409, title: 'Order in flight' },
  [OrdersErrorCode.OutcomeUnknown]: { status: 409, title: 'Order outcome unknown' },
  [OrdersErrorCode.BodyTooLarge]: { status: 413, title: 'Order body too large' },
  [OrdersErrorCode.UnsupportedMediaType]: { status: 415, title: 'Unsupported media type' },
  [OrdersErrorCode.IdempotencyKeyReused]: { status: 422, title: 'Idempotency-Key reused' },
  [OrdersErrorCode.TokenRejected]: { status: 502, title: 'Provider rejected the token' },
  [OrdersErrorCode.ProviderUnreachable]: { status: 502, title: 'Provider unreachable' },
  [OrdersErrorCode.ProviderBadResponse]: { status: 502, title: 'Bad provider response' },
  [OrdersErrorCode.UpstreamEchoedToken]: {
    status: 502,
    title: 'Provider answer echoed the token',
  },
  [OrdersErrorCode.IdempotencyUnavailable]: {
    status: 503,
    title: 'Idempotency store unavailable',
  },
  [OrdersErrorCode.IdempotencyRecordTampered]: {
    status: 500,
    title: 'Idempotency record tampered',
  },
  [OrdersErrorCode.IdempotencyRecordsExceeded]: {
    status: 429,
    title: 'Too many Idempotency-Key records',
    retryAfterSeconds: 1,
  },
  [OrdersErrorCode.IdempotencyBytesExceeded]: {
    status: 429,
    title: 'Too many Idempotency-Key bytes stored',
    retryAfterSeconds: 1,
  },
  [OrdersErrorCode.ProviderTimeout]: { status: 504, title: 'Provider timeout' },
  [OrdersErrorCode.RateLimited]: { status: 429, title: 'Rate limited', retryAfterSeconds: 1 },
  [OrdersErrorCode.CallerBudgetExceeded]: {
    status: 429,
    title: 'Caller over its in-flight budget',
    retryAfterSeconds: 1,
  },
  [OrdersErrorCode.BodyBudgetExhausted]: {
    status: 503,
    title: 'Replica body budget exhausted',
    retryAfterSeconds: 1,
  },
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
  [ForwardErrorCode.CallerBudgetExceeded]: {
    status: 429,
    title: 'Caller over its in-flight budget',
    retryAfterSeconds: 1,
  },
  [ForwardErrorCode.BodyBudgetExhausted]: {
    status: 503,
    title: 'Replica body budget exhausted',
    retryAfterSeconds: 1,
  },
};

export class ForwardingException extends BrokerException<ForwardingErrorCode> {
  override get problemStatus(): ProblemStatus {
    return FORWARDING_PROBLEMS[this.code];
  }
}

/** `POST /orders`, and the provider passthrough. */
export type ForwardingProfile = 'orders' | 'forward';

const both = (code: OrdersErrorCode) => ({ orders: code, forward: code });
const each = (orders: OrdersErrorCode, forward: ForwardErrorCode) => ({ orders, forward });

/** The idempotency codes are shared; the rest say which route answered. */
export const FAILURE_CODES = {
  inFlight: each(OrdersErrorCode.InFlight, ForwardErrorCode.InFlight),
  outcomeUnknown: each(OrdersErrorCode.OutcomeUnknown, ForwardErrorCode.OutcomeUnknown),
  tokenRejected: each(OrdersErrorCode.TokenRejected, ForwardErrorCode.TokenRejected),
  unreachable: each(OrdersErrorCode.ProviderUnreachable, ForwardErrorCode.ProviderUnreachable),
  badResponse: each(OrdersErrorCode.ProviderBadResponse, ForwardErrorCode.ProviderBadResponse),
  bodyTooLarge: each(OrdersErrorCode.BodyTooLarge, ForwardErrorCode.BodyTooLarge),
  timeout: each(OrdersErrorCode.ProviderTimeout, ForwardErrorCode.ProviderTimeout),
  echoedToken: each(OrdersErrorCode.UpstreamEchoedToken, ForwardErrorCode.UpstreamEchoedToken),
  keyReused: both(OrdersErrorCode.IdempotencyKeyReused),
  storeUnavailable: both(OrdersErrorCode.IdempotencyUnavailable),
  tampered: both(OrdersErrorCode.IdempotencyRecordTampered),
  callerLimit: both(OrdersErrorCode.IdempotencyRecordsExceeded),
  callerBytes: both(OrdersErrorCode.IdempotencyBytesExceeded),
  rateLimited: each(OrdersErrorCode.RateLimited, ForwardErrorCode.RateLimited),
  callerBudget: each(OrdersErrorCode.CallerBudgetExceeded, ForwardErrorCode.CallerBudgetExceeded),
  bodyBudget: each(OrdersErrorCode.BodyBudgetExhausted, ForwardErrorCode.BodyBudgetExhausted),
} satisfies Record<string, Record<ForwardingProfile, ForwardingErrorCode>>;

/** What went wrong, in terms both profiles share. */
export type ForwardingFailure = keyof typeof FAILURE_CODES;

export function forwardingProblem(
  profile: ForwardingProfile,
  failure: ForwardingFailure,
  message: string,
  options?: BrokerExceptionOptions,
): ForwardingException {
  return new ForwardingException(FAILURE_CODES[failure][profile], message, options);
}
