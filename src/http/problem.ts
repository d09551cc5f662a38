import { HttpException } from '@nestjs/common';
import { AdminException } from '../admin/admin.exception';
import { CallerAuthErrorCode, CallerAuthException } from '../caller-auth/caller-auth.exception';
import { BrokerException } from '../errors/broker.exception';
import { ForwardException } from '../forward/forward.exception';
import { OrdersException } from '../orders/orders.exception';
import { TokenException } from '../token/token.exception';
import { RequestErrorCode, RequestException } from './request.exception';
import { type ProblemCode, statusFor } from './problem-status';
import { SECURITY_HEADERS } from './security-headers';

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
