import type { BrokerExceptionOptions } from '../errors/broker.exception';
import { ForwardErrorCode, ForwardException } from './forward.exception';
import { ORDERS_PROBLEMS, OrdersErrorCode, OrdersException } from './orders.exception';

export type ForwardingFailure =
  | 'inFlight'
  | 'outcomeUnknown'
  | 'keyReused'
  | 'tokenRejected'
  | 'unreachable'
  | 'badResponse'
  | 'bodyTooLarge'
  | 'timeout'
  | 'storeUnavailable'
  | 'tampered'
  | 'echoedToken'
  | 'callerLimit';

/** `POST /orders`, and the provider passthrough. */
export type ForwardingProfile = 'orders' | 'forward';

type ForwardingCode = OrdersErrorCode | ForwardErrorCode;

const both = (code: OrdersErrorCode) => ({ orders: code, forward: code });

/** The idempotency codes are shared; the rest say which route answered. */
export const FAILURE_CODES: Record<ForwardingFailure, Record<ForwardingProfile, ForwardingCode>> = {
  inFlight: { orders: OrdersErrorCode.InFlight, forward: ForwardErrorCode.InFlight },
  outcomeUnknown: {
    orders: OrdersErrorCode.OutcomeUnknown,
    forward: ForwardErrorCode.OutcomeUnknown,
  },
  tokenRejected: { orders: OrdersErrorCode.TokenRejected, forward: ForwardErrorCode.TokenRejected },
  unreachable: {
    orders: OrdersErrorCode.ProviderUnreachable,
    forward: ForwardErrorCode.ProviderUnreachable,
  },
  badResponse: {
    orders: OrdersErrorCode.ProviderBadResponse,
    forward: ForwardErrorCode.ProviderBadResponse,
  },
  bodyTooLarge: { orders: OrdersErrorCode.BodyTooLarge, forward: ForwardErrorCode.BodyTooLarge },
  timeout: { orders: OrdersErrorCode.ProviderTimeout, forward: ForwardErrorCode.ProviderTimeout },
  echoedToken: {
    orders: OrdersErrorCode.UpstreamEchoedToken,
    forward: ForwardErrorCode.UpstreamEchoedToken,
  },
  keyReused: both(OrdersErrorCode.IdempotencyKeyReused),
  storeUnavailable: both(OrdersErrorCode.IdempotencyUnavailable),
  tampered: both(OrdersErrorCode.IdempotencyRecordTampered),
  callerLimit: both(OrdersErrorCode.IdempotencyRecordsExceeded),
};

/** How each use words its messages, and its `providerLatency` `call` label. */
export const PROFILES: Record<
  ForwardingProfile,
  { noun: string; uncertain: string; call: string }
> = {
  orders: { noun: 'order', uncertain: 'the order may or may not exist', call: 'orders' },
  forward: {
    noun: 'request',
    uncertain: 'the provider may or may not have processed the request',
    call: 'forward',
  },
};

export function forwardingProblem(
  profile: ForwardingProfile,
  failure: ForwardingFailure,
  message: string,
  options?: BrokerExceptionOptions,
): OrdersException | ForwardException {
  const code = FAILURE_CODES[failure][profile];
  return code in ORDERS_PROBLEMS
    ? new OrdersException(code as OrdersErrorCode, message, options)
    : new ForwardException(code as ForwardErrorCode, message, options);
}
