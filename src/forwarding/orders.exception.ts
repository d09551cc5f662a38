import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

/**
 * Why `POST /orders` was not answered with the provider's own response. Stable: callers and
 * dashboards key on these.
 */
export enum OrdersErrorCode {
  /** 400: the body is empty, not JSON, or not a JSON object. */
  InvalidBody = 'order_body_invalid',
  /** 400: the `Idempotency-Key` header is repeated, empty, too long or not printable ASCII. */
  InvalidIdempotencyKey = 'idempotency_key_invalid',
  /** 409: the first request with this `Idempotency-Key` is still being forwarded. */
  InFlight = 'order_in_flight',
  /**
   * 409: the first request with this `Idempotency-Key` may or may not have created an order
   * (the provider did not answer in time, or the connection broke after sending). Only the
   * provider can tell: reconcile there before creating the order again under a new key.
   */
  OutcomeUnknown = 'order_outcome_unknown',
  /** 413: the body exceeds `orders.bodyLimitBytes`. */
  BodyTooLarge = 'order_body_too_large',
  /** 415: the body is not `application/json` (UTF-8). */
  UnsupportedMediaType = 'order_unsupported_media_type',
  /** 422: the `Idempotency-Key` was first used with another body. */
  IdempotencyKeyReused = 'idempotency_key_reused',
  /** 502: the provider rejected a freshly obtained token too. No order was created. */
  TokenRejected = 'order_token_rejected',
  /** 502: no connection to the provider, or it broke (see the detail for whether it was sent). */
  ProviderUnreachable = 'order_provider_unreachable',
  /** 502: the provider's answer could not be relayed (too large, or cut off). */
  ProviderBadResponse = 'order_provider_bad_response',
  /**
   * 502: the provider's answer contained the access token the broker sent (an echo of the
   * `Authorization` header): withheld, never relayed or stored. The order may exist.
   */
  UpstreamEchoedToken = 'order_upstream_echoed_token',
  /** 503: the idempotency store (Redis) is unreachable, so a duplicate cannot be ruled out. */
  IdempotencyUnavailable = 'idempotency_unavailable',
  /**
   * 500: the stored outcome of this `Idempotency-Key` fails its integrity check (it was changed
   * in Redis by something other than a broker): nothing is replayed and nothing is sent.
   */
  IdempotencyRecordTampered = 'idempotency_record_tampered',
  /**
   * 429: the caller holds the most `Idempotency-Key` records it may for the client; nothing was
   * sent (`Retry-After`: until its oldest record expires).
   */
  IdempotencyRecordsExceeded = 'idempotency_records_exceeded',
  /** 504: the provider did not answer in time after the order was sent. */
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

/** A `POST /orders` that the broker answers itself. `retryAfterSeconds` feeds `Retry-After`. */
export class OrdersException extends BrokerException<OrdersErrorCode> {
  override get problemStatus(): ProblemStatus {
    return ORDERS_PROBLEMS[this.code];
  }
}
