import { HttpException } from '@nestjs/common';
import { BrokerException, type ProblemStatus } from '../errors/broker.exception';
import { RequestErrorCode, RequestException } from './request.exception';
import { SECURITY_HEADERS } from './security-headers';

/** RFC 9457, plus the broker's stable `code` and the request id. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
  requestId?: string;
}

const PROBLEM_CONTENT_TYPE = 'application/problem+json';

const INTERNAL_ERROR: ProblemStatus = { status: 500, title: 'Internal error' };

/**
 * The status, headers and bytes of every problem answer, whether Fastify sends it or a front
 * writes to Node's response itself: every header but `x-request-id` (the sender adds it) and
 * connection management.
 */
export function problemAnswer(
  err: unknown,
  requestId: string,
): { problem: Problem; headers: Record<string, string>; body: Buffer } {
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
 * A caller-facing exception keeps its message and status; anything else (internal domains
 * included) is a generic 500 that echoes nothing: its text may quote an upstream body or secret.
 */
export function toProblem(
  err: unknown,
  requestId?: string,
): { problem: Problem; headers: Record<string, string> } {
  const framework = err instanceof HttpException || isFastifyError(err);
  const known: BrokerException | undefined = framework
    ? fromHttpStatus(err)
    : err instanceof BrokerException
      ? err
      : undefined;
  const answer = known?.problemStatus;
  if (known === undefined || answer === undefined) {
    const detail = framework
      ? 'unexpected error'
      : `unexpected error; quote request id ${requestId ?? '(none)'} when reporting it`;
    return { problem: problemOf('internal_error', INTERNAL_ERROR, detail, requestId), headers: {} };
  }
  const headers: Record<string, string> = {};
  const retryAfter = known.retryAfterSeconds ?? answer.retryAfterSeconds;
  if (retryAfter !== undefined) headers['retry-after'] = String(retryAfter);
  if (answer.challenge !== undefined) headers['www-authenticate'] = answer.challenge;
  return { problem: problemOf(known.code, answer, known.message, requestId), headers };
}

function problemOf(
  code: string,
  { status, title }: ProblemStatus,
  detail: string,
  requestId: string | undefined,
): Problem {
  return { type: `urn:token-broker:problem:${code}`, title, status, detail, code, requestId };
}

function isFastifyError(err: unknown): err is { statusCode: number; message: string } {
  const e = typeof err === 'object' ? (err as { statusCode?: unknown; code?: unknown }) : null;
  return (
    typeof e?.statusCode === 'number' && typeof e.code === 'string' && e.code.startsWith('FST_')
  );
}

/** Our own wording for the framework's client errors. */
const FRAMEWORK_ERRORS: Partial<Record<number, readonly [RequestErrorCode, string]>> = {
  400: [RequestErrorCode.InvalidRequest, 'the request is malformed'],
  404: [RequestErrorCode.NotFound, 'no such route; see the README for the API'],
  405: [RequestErrorCode.MethodNotAllowed, 'method not allowed on this route'],
  413: [RequestErrorCode.PayloadTooLarge, 'the request body is too large'],
  415: [RequestErrorCode.UnsupportedMediaType, 'send application/json'],
};

/** Undefined (a 500) for a server error. */
function fromHttpStatus(err: HttpException | { statusCode: number }): RequestException | undefined {
  const status = err instanceof HttpException ? err.getStatus() : err.statusCode;
  const [code, detail] = FRAMEWORK_ERRORS[status] ?? [
    RequestErrorCode.InvalidRequest,
    'the request was refused',
  ];
  return status >= 400 && status < 500 ? new RequestException(code, detail) : undefined;
}
