import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

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
  ProviderTimeout = 'order_provider_timeout',
}

export const ORDERS_PROBLEMS: ProblemTable<OrdersErrorCode> = {
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
  [OrdersErrorCode.ProviderTimeout]: { status: 504, title: 'Provider timeout' },
};

export class OrdersException extends BrokerException<OrdersErrorCode> {
  override get problemStatus(): ProblemStatus {
    return ORDERS_PROBLEMS[this.code];
  }
}
