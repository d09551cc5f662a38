import { ADMIN_PROBLEMS } from '../admin/admin.exception';
import { CALLER_AUTH_PROBLEMS } from '../caller-auth/caller-auth.exception';
import type { ProblemStatus } from '../errors/broker.exception';
import { FORWARDING_PROBLEMS } from '../forwarding/forwarding.exception';
import { REQUEST_PROBLEMS, RequestErrorCode } from '../http/request.exception';
import { TOKEN_PROBLEMS } from '../token/token.exception';
import { header, type Json, NO_STORE, ref, RETRY_AFTER } from './openapi.components';

// The document reads each domain's own table, the one its exceptions carry: it cannot drift
// from what the problem writer answers, and no code is documented at a status it is not sent with.
const TABLES = {
  ...TOKEN_PROBLEMS,
  ...CALLER_AUTH_PROBLEMS,
  ...REQUEST_PROBLEMS,
  ...FORWARDING_PROBLEMS,
  ...ADMIN_PROBLEMS,
  internal_error: { status: 500, title: 'Internal error' },
};

/** Every code a caller can be answered with, as plain strings. */
export type Code = `${keyof typeof TABLES}`;
const STATUSES: Readonly<Record<Code, ProblemStatus>> = TABLES;

/** Where the title alone does not say what a caller can do. */
const HINTS: Partial<Record<Code, string>> = {
  request_timeout:
    'the request line and headers, or the whole request, did not arrive in time (HTTP_HEADERS_TIMEOUT_MS, HTTP_REQUEST_TIMEOUT_MS)',
  payload_too_large: 'a request body over the server limit',
  internal_error: 'unexpected failure; quote the request id',
  forbidden:
    "the caller may not use this client, or lacks this route's scope (`token`, `forward`, `admin`)",
  token_unavailable: 'no valid token can be had now (or the refresh lock stayed held)',
  order_body_too_large: 'body over the configured limit',
  order_unsupported_media_type: 'not application/json',
  idempotency_key_reused: 'same Idempotency-Key, different query or body',
  order_in_flight: 'the first request with this key is in flight',
  order_outcome_unknown: "the first request's outcome is unknown",
  idempotency_record_tampered:
    'a stored idempotency record failed its integrity check (never replayed); quote the request id',
  idempotency_records_exceeded:
    'the caller holds the most Idempotency-Key records it may (nothing sent)',
  order_upstream_echoed_token: "the provider's answer contained the access token (withheld)",
  order_provider_timeout: 'sent, no answer in time: check with the provider',
  forward_not_allowed: "the client's allow-list does not cover the method and path",
  forward_body_too_large: 'body over FORWARD_BODY_LIMIT_BYTES',
  forward_rate_limited: "over the client's or the caller's rate limit at the broker",
  order_rate_limited: "over the client's or the caller's order rate limit at the broker",
  order_caller_budget_exceeded:
    'the caller has too many orders, or too many body bytes, in progress on this replica',
  forward_caller_budget_exceeded:
    'the caller has too many requests, or too many body bytes, in progress on this replica',
  order_body_budget_exhausted: 'the replica holds as many request bodies as its memory allows',
  forward_body_budget_exhausted: 'the replica holds as many request bodies as its memory allows',
  idempotency_bytes_exceeded:
    'the caller holds the most bytes of Idempotency-Key records it may (nothing sent)',
  forward_upstream_echoed_token: "the provider's answer contained the access token (withheld)",
  forward_provider_timeout: 'sent, no answer in time: check with the provider',
  admin_store_unavailable: 'Redis does not answer; retry',
};

/** With `relayed`, each status may also be the provider's own JSON answer, passed through. */
export function problems(codes: Code[], relayed = false): Record<string, Json> {
  const byStatus = new Map<number, Code[]>();
  for (const code of codes) {
    const { status } = STATUSES[code];
    byStatus.set(status, [...(byStatus.get(status) ?? []), code]);
  }
  const entries = [...byStatus].map(([status, group]): [string, Json] => [
    String(status),
    {
      description: group.map((c) => `\`${c}\`: ${HINTS[c] ?? STATUSES[c].title}.`).join(' '),
      headers: {
        ...NO_STORE,
        ...(status === 401 && { 'WWW-Authenticate': header('WWW-Authenticate-Bearer') }),
        ...([409, 429, 503].includes(status) && RETRY_AFTER),
      },
      content: {
        'application/problem+json': {
          schema: { allOf: [ref('Problem')], properties: { code: { enum: group } } },
          example: {
            type: `urn:token-broker:problem:${group[0]}`,
            title: STATUSES[group[0]].title,
            status,
            detail: 'a sentence saying what is wrong and what to do',
            code: group[0],
            requestId: '9f1c2a7e-4d1b-4f0e-9a55-0c6b8d2e1f3a',
          },
        },
        ...(relayed && { 'application/json': { schema: ref('ProviderAnswer') } }),
      },
    },
  ]);
  return Object.fromEntries(entries);
}

export function oauthError(description: string, errors: string[], headers: Json = {}): Json {
  return {
    description: `${description}. \`error\`: ${errors.map((c) => `\`${c}\``).join(', ')}.`,
    headers: { ...NO_STORE, Pragma: header('Pragma'), ...headers },
    content: {
      'application/json': {
        schema: { allOf: [ref('OAuthError')], properties: { error: { enum: errors } } },
        example: { error: errors[0], error_description: 'what is wrong' },
      },
    },
  };
}

/** Answers any route can give before its handler runs: the request's own, but a bad request. */
export const GENERIC: Code[] = [
  ...Object.values(RequestErrorCode).filter((code) => code !== RequestErrorCode.InvalidRequest),
  'internal_error',
];
export const CALLER_AUTH: Code[] = ['unauthenticated', 'forbidden'];
export const NOT_FOUND: Code[] = ['unknown_client', 'not_found'];
export const UNAVAILABLE: Code[] = [
  'token_unavailable',
  'credentials_rejected',
  'credentials_unavailable',
  'shutting_down',
  'caller_auth_unavailable',
];
export const FORWARDING: Code[] = [
  'invalid_request',
  ...CALLER_AUTH,
  ...NOT_FOUND,
  'request_timeout',
  'internal_error',
  ...UNAVAILABLE,
];
