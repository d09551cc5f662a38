import { AdminErrorCode } from '../admin/admin.exception';
import { CallerAuthErrorCode } from '../caller-auth/caller-auth.exception';
import { ForwardErrorCode } from '../forward/forward.exception';
import { OrdersErrorCode } from '../orders/orders.exception';
import { TokenErrorCode } from '../token/token.exception';
import { RequestErrorCode } from './request.exception';

// The status and title of every problem code, apart from the problem writer (`problem.ts`) so
// that what only describes the codes (the OpenAPI document) loads without the framework.

/** Every `code` a problem response can carry. Adding a domain adds its enum here. */
export type ProblemCode =
  | TokenErrorCode
  | CallerAuthErrorCode
  | RequestErrorCode
  | OrdersErrorCode
  | AdminErrorCode
  | ForwardErrorCode
  | 'internal_error';

function assertUnreachable(x: never): never {
  throw new Error(`unmapped problem code: ${String(x)}`);
}

/** How a code is answered over HTTP. */
export interface ProblemStatus {
  status: number;
  title: string;
  /** `Retry-After` when the exception does not say (its `retryAfterSeconds` wins); none if absent. */
  retryAfterSeconds?: number;
}

/** The one place codes become HTTP statuses. A new code is a compile error until mapped. */
export function statusFor(code: ProblemCode): ProblemStatus {
  switch (code) {
    case RequestErrorCode.InvalidRequest:
      return { status: 400, title: 'Invalid request' };
    case TokenErrorCode.ClientRequired:
      return { status: 400, title: 'Client required' };
    case CallerAuthErrorCode.Unauthenticated:
      return { status: 401, title: 'Unauthenticated' };
    case CallerAuthErrorCode.Forbidden:
      return { status: 403, title: 'Forbidden' };
    case RequestErrorCode.NotFound:
      return { status: 404, title: 'Not found' };
    case TokenErrorCode.UnknownClient:
      return { status: 404, title: 'Unknown client' };
    case RequestErrorCode.MethodNotAllowed:
      return { status: 405, title: 'Method not allowed' };
    case RequestErrorCode.PayloadTooLarge:
      return { status: 413, title: 'Payload too large' };
    case RequestErrorCode.RequestTimeout:
      return { status: 408, title: 'Request timeout' };
    case RequestErrorCode.UnsupportedMediaType:
      return { status: 415, title: 'Unsupported media type' };
    case 'internal_error':
      return { status: 500, title: 'Internal error' };
    case TokenErrorCode.Unavailable:
      return { status: 503, title: 'Token unavailable', retryAfterSeconds: 1 };
    case TokenErrorCode.CredentialsRejected:
      return { status: 503, title: 'Provider credentials rejected', retryAfterSeconds: 1 };
    case TokenErrorCode.CredentialsUnavailable:
      return { status: 503, title: 'Provider credentials unavailable', retryAfterSeconds: 1 };
    case TokenErrorCode.ShuttingDown:
      return { status: 503, title: 'Shutting down', retryAfterSeconds: 1 };
    case CallerAuthErrorCode.Unavailable:
      return { status: 503, title: 'Caller verification unavailable', retryAfterSeconds: 2 };
    case OrdersErrorCode.InvalidBody:
      return { status: 400, title: 'Invalid order body' };
    case OrdersErrorCode.InvalidIdempotencyKey:
      return { status: 400, title: 'Invalid Idempotency-Key' };
    case OrdersErrorCode.InFlight:
      return { status: 409, title: 'Order in flight' };
    case OrdersErrorCode.OutcomeUnknown:
      return { status: 409, title: 'Order outcome unknown' };
    case OrdersErrorCode.BodyTooLarge:
      return { status: 413, title: 'Order body too large' };
    case OrdersErrorCode.UnsupportedMediaType:
      return { status: 415, title: 'Unsupported media type' };
    case OrdersErrorCode.IdempotencyKeyReused:
      return { status: 422, title: 'Idempotency-Key reused' };
    case OrdersErrorCode.TokenRejected:
      return { status: 502, title: 'Provider rejected the token' };
    case OrdersErrorCode.ProviderUnreachable:
      return { status: 502, title: 'Provider unreachable' };
    case OrdersErrorCode.ProviderBadResponse:
      return { status: 502, title: 'Bad provider response' };
    case OrdersErrorCode.UpstreamEchoedToken:
      return { status: 502, title: 'Provider answer echoed the token' };
    case OrdersErrorCode.IdempotencyUnavailable:
      return { status: 503, title: 'Idempotency store unavailable' };
    case OrdersErrorCode.IdempotencyRecordTampered:
      return { status: 500, title: 'Idempotency record tampered' };
    case OrdersErrorCode.IdempotencyRecordsExceeded:
      return { status: 429, title: 'Too many Idempotency-Key records', retryAfterSeconds: 1 };
    case OrdersErrorCode.ProviderTimeout:
      return { status: 504, title: 'Provider timeout' };
    case AdminErrorCode.RefreshFailed:
      return { status: 502, title: 'Forced refresh failed' };
    case AdminErrorCode.StoreUnavailable:
      return { status: 503, title: 'Shared store unavailable', retryAfterSeconds: 2 };
    // Provider passthrough (issue #15).
    case ForwardErrorCode.PathInvalid:
      return { status: 400, title: 'Invalid provider path' };
    case ForwardErrorCode.NotAllowed:
      return { status: 403, title: "Not allowed by the client's allow-list" };
    case ForwardErrorCode.InFlight:
      return { status: 409, title: 'Request in flight' };
    case ForwardErrorCode.OutcomeUnknown:
      return { status: 409, title: 'Request outcome unknown' };
    case ForwardErrorCode.BodyTooLarge:
      return { status: 413, title: 'Request body too large' };
    case ForwardErrorCode.RateLimited:
      return { status: 429, title: 'Rate limited', retryAfterSeconds: 1 };
    case ForwardErrorCode.TokenRejected:
      return { status: 502, title: 'Provider rejected the token' };
    case ForwardErrorCode.ProviderUnreachable:
      return { status: 502, title: 'Provider unreachable' };
    case ForwardErrorCode.ProviderBadResponse:
      return { status: 502, title: 'Bad provider response' };
    case ForwardErrorCode.UpstreamEchoedToken:
      return { status: 502, title: 'Provider answer echoed the token' };
    case ForwardErrorCode.ProviderTimeout:
      return { status: 504, title: 'Provider timeout' };
    default:
      return assertUnreachable(code);
  }
}
