import { HttpException } from '@nestjs/common';
import { AdminErrorCode, AdminException } from '../admin/admin.exception';
import { CallerAuthErrorCode, CallerAuthException } from '../caller-auth/caller-auth.exception';
import { BrokerException } from '../errors/broker.exception';
import { ForwardErrorCode, ForwardException } from '../forward/forward.exception';
import { OrdersErrorCode, OrdersException } from '../orders/orders.exception';
import { TokenErrorCode, TokenException } from '../token/token.exception';
import { RequestErrorCode, RequestException } from './request.exception';
import { SECURITY_HEADERS } from './security-headers';

/** Every `code` a problem response can carry. Adding a domain adds its enum here. */
export type ProblemCode =
  | TokenErrorCode
  | CallerAuthErrorCode
  | RequestErrorCode
  | OrdersErrorCode
  | AdminErrorCode
  | ForwardErrorCode
  | 'internal_error';

/** RFC 9457 problem details, plus the broker's stable `code` and the request id. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: ProblemCode;
  requestId?: string;
}

export interface ProblemResponse {
  problem: Problem;
  headers: Record<string, string>;
}

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

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

/** A whole problem answer for a front that writes to Node's response itself. */
export interface ProblemAnswer {
  readonly problem: Problem;
  /** Every header but `x-request-id` (the front adds the request's) and connection management. */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Buffer;
}

/**
 * `err` as the `application/problem+json` answer a Fastify route sends (`sendProblem` and the
 * app's `onSend` hook), for the fronts on Node's request event (`GET /token`, `POST /orders`):
 * the same status, headers and bytes.
 */
export function problemAnswer(err: unknown, requestId: string): ProblemAnswer {
  const { problem, headers } = toProblem(err, requestId);
  const body = Buffer.from(JSON.stringify(problem));
  return {
    problem,
    headers: {
      ...headers,
      'cache-control': 'no-store',
      'content-type': `${PROBLEM_CONTENT_TYPE}; charset=utf-8`,
      ...SECURITY_HEADERS,
      'content-length': String(body.length),
    },
    body,
  };
}

/**
 * Turns any thrown value into a problem response. Known exceptions keep their message (written
 * to be safe and actionable); anything else becomes a generic 500 that echoes nothing, since an
 * unknown error's text may quote an upstream body or a secret.
 */
export function toProblem(err: unknown, requestId?: string): ProblemResponse {
  const headers: Record<string, string> = {};
  let code: ProblemCode;
  let detail: string;
  if (isCallerFacing(err)) {
    code = err.code;
    detail = err.message;
    const retryAfter = err.retryAfterSeconds ?? statusFor(code).retryAfterSeconds;
    if (retryAfter !== undefined) headers['retry-after'] = String(retryAfter);
    if (code === CallerAuthErrorCode.Unauthenticated) {
      headers['www-authenticate'] = 'Bearer realm="token-broker"';
    }
  } else if (err instanceof HttpException || isFastifyError(err)) {
    ({ code, detail } = fromHttpStatus(err));
  } else {
    code = 'internal_error';
    detail = `unexpected error; quote request id ${requestId ?? '(none)'} when reporting it`;
  }
  const { status, title } = statusFor(code);
  return {
    problem: { type: `urn:token-broker:problem:${code}`, title, status, detail, code, requestId },
    headers,
  };
}

/**
 * The domains whose codes answer the caller. Any other exception (provider, secrets, stores,
 * config) is the broker's own failure: its message may name internals, so it becomes a 500.
 */
const CALLER_FACING = [
  TokenException,
  CallerAuthException,
  RequestException,
  OrdersException,
  AdminException,
  ForwardException,
];

function isCallerFacing(
  err: unknown,
): err is BrokerException<Exclude<ProblemCode, 'internal_error'>> {
  return CALLER_FACING.some((domain) => err instanceof domain);
}

function isFastifyError(
  err: unknown,
): err is { statusCode: number; code?: string; message: string } {
  return (
    typeof err === 'object' &&
    err !== null &&
    typeof (err as { statusCode?: unknown }).statusCode === 'number' &&
    typeof (err as { code?: unknown }).code === 'string' &&
    String((err as { code: string }).code).startsWith('FST_')
  );
}

/** Framework errors (Nest's HttpException, Fastify's FST_*) by status, with our own wording. */
function fromHttpStatus(err: HttpException | { statusCode: number }): {
  code: ProblemCode;
  detail: string;
} {
  const status = err instanceof HttpException ? err.getStatus() : err.statusCode;
  switch (status) {
    case 400:
      return { code: RequestErrorCode.InvalidRequest, detail: 'the request is malformed' };
    case 404:
      return {
        code: RequestErrorCode.NotFound,
        detail: 'no such route; see the README for the API',
      };
    case 405:
      return {
        code: RequestErrorCode.MethodNotAllowed,
        detail: 'method not allowed on this route',
      };
    case 413:
      return { code: RequestErrorCode.PayloadTooLarge, detail: 'the request body is too large' };
    case 415:
      return { code: RequestErrorCode.UnsupportedMediaType, detail: 'send application/json' };
    default:
      return status >= 400 && status < 500
        ? { code: RequestErrorCode.InvalidRequest, detail: 'the request was refused' }
        : { code: 'internal_error', detail: 'unexpected error' };
  }
}
