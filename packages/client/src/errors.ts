/**
 * The `code`s the broker's problem+json answers carry (docs/api.md in its repository), plus the
 * client's own: `network_error` (no HTTP answer: refused, reset, DNS), `timeout` (no answer
 * within `requestTimeoutMs`) and `unexpected_redirect` (a 3xx, never followed: `baseUrl` does
 * not point at the broker).
 */
export type BrokerErrorCode =
  // Requests and caller authentication
  | 'invalid_request'
  | 'not_found'
  | 'method_not_allowed'
  | 'unsupported_media_type'
  | 'payload_too_large'
  | 'unauthenticated'
  | 'forbidden'
  | 'caller_auth_unavailable'
  // GET /token
  | 'client_required'
  | 'unknown_client'
  | 'token_unavailable'
  | 'credentials_rejected'
  | 'credentials_unavailable'
  | 'shutting_down'
  // POST /orders
  | 'order_body_invalid'
  | 'idempotency_key_invalid'
  | 'order_in_flight'
  | 'order_outcome_unknown'
  | 'order_body_too_large'
  | 'order_unsupported_media_type'
  | 'idempotency_key_reused'
  | 'order_token_rejected'
  | 'order_provider_unreachable'
  | 'order_provider_bad_response'
  | 'idempotency_unavailable'
  | 'order_provider_timeout'
  | 'internal_error'
  // The client's own
  | 'network_error'
  | 'timeout'
  | 'unexpected_redirect';

/** What {@link BrokerError} is built from. */
export interface BrokerErrorInit {
  code: BrokerErrorCode | (string & {});
  message: string;
  /** HTTP status, or 0 when there was no answer. */
  status: number;
  /** The broker's `X-Request-Id`, to quote when reporting a problem. */
  requestId?: string;
  /** `Retry-After` in milliseconds, when the broker sent one. */
  retryAfterMs?: number;
  cause?: unknown;
}

/**
 * Any failure talking to the broker. `code` is the broker's stable problem code (switch on it,
 * never on `message`); the subclasses group the codes a caller handles alike.
 */
export class BrokerError extends Error {
  readonly code: BrokerErrorCode | (string & {});
  readonly status: number;
  readonly requestId?: string;
  readonly retryAfterMs?: number;

  constructor(init: BrokerErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.status = init.status;
    this.requestId = init.requestId;
    this.retryAfterMs = init.retryAfterMs;
  }

  /** Whether the same request may succeed later (the client already retried it). */
  get retryable(): boolean {
    return RETRYABLE.has(this.code);
  }
}

/** 401 `unauthenticated` / 403 `forbidden`: the caller's credential or grants are wrong. */
export class BrokerAuthError extends BrokerError {}
/** No answer, or 503/`Retry-After`: the broker or the provider cannot serve now. */
export class BrokerUnavailableError extends BrokerError {}
/** 4xx the caller must fix (bad client id, bad body, a reused Idempotency-Key). */
export class BrokerRequestError extends BrokerError {}
/** `order_outcome_unknown`: the order may or may not exist; check with the provider. */
export class OrderOutcomeUnknownError extends BrokerError {}

const RETRYABLE = new Set<string>([
  'network_error',
  'timeout',
  'caller_auth_unavailable',
  'token_unavailable',
  'credentials_rejected',
  'credentials_unavailable',
  'shutting_down',
  'idempotency_unavailable',
  'order_in_flight',
  'order_provider_unreachable',
  'order_provider_timeout',
  'internal_error',
]);

/** The error class for a code and status. */
export function brokerError(init: BrokerErrorInit): BrokerError {
  if (init.code === 'unauthenticated' || init.code === 'forbidden') {
    return new BrokerAuthError(init);
  }
  if (init.code === 'order_outcome_unknown') return new OrderOutcomeUnknownError(init);
  if (init.status === 0 || init.status === 503 || RETRYABLE.has(init.code)) {
    return new BrokerUnavailableError(init);
  }
  return new BrokerRequestError(init);
}
