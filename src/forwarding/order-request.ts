import { isUtf8 } from 'node:buffer';
import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import type { BrokerExceptionOptions } from '../errors/broker.exception';
import { spansEnabled } from '../tracing/spans';
import { OrdersErrorCode, ForwardingException } from './forwarding.exception';

/**
 * Everything else stays at the broker: the caller's `Authorization` (a broker credential,
 * useless and dangerous upstream), cookies, `Host`, proxy headers and hop-by-hop headers.
 */
export interface OrderHeaders {
  readonly idempotencyKey?: string;
  readonly forward: Readonly<Record<string, string>>;
}

/** RFC 9110 §7.6.1; also covers a header nominated by `Connection`. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/** Printable ASCII, no leading or trailing space, 1-255 characters (Stripe and the IETF draft fit). */
const IDEMPOTENCY_KEY = /^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/;
/** W3C Trace Context `traceparent`, version 00 layout (later versions start the same way). */
const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;
const TRACESTATE = /^[\x20-\x7e]{1,512}$/;
/** A `charset` parameter's value naming UTF-8, bare or quoted, in any case. */
const UTF8_CHARSET = /^(?:utf-?8|"utf-?8")$/i;

/**
 * A malformed `Idempotency-Key` is a 400: dropping it would drop the caller's protection
 * against duplicates. A bad `traceparent` is dropped (tracing is best effort), and none is
 * passed on when the broker traces itself: its own span, a child of the caller's, goes instead.
 * `rawHeaders` tells a repeated key (Node joins repeats with ", ") from one with a comma.
 */
export function readOrderHeaders(
  headers: IncomingHttpHeaders,
  rawHeaders: readonly string[],
  requestId: string,
): OrderHeaders {
  const nominated = nominatedByConnection(headers);
  const forward: Record<string, string> = {};
  const pass = (name: string, value: string) => {
    if (!nominated.has(name) && !HOP_BY_HOP.has(name)) forward[name] = value;
  };

  const idempotencyKey = readIdempotencyKey(headers, rawHeaders);
  if (idempotencyKey !== undefined) pass('idempotency-key', idempotencyKey);
  forward['x-request-id'] = requestId;
  const traceparent = spansEnabled()
    ? undefined
    : single(headers.traceparent)?.trim().toLowerCase();
  if (traceparent !== undefined && isValidTraceparent(traceparent)) {
    pass('traceparent', traceparent);
    const tracestate = single(headers.tracestate)?.trim();
    if (tracestate !== undefined && forward.traceparent && TRACESTATE.test(tracestate)) {
      pass('tracestate', tracestate);
    }
  }
  return { idempotencyKey, forward };
}

/**
 * The headers the caller's `Connection` names: hop-by-hop for this connection only (RFC 9110
 * §7.6.1), so none of them travels on, whatever its name.
 */
export function nominatedByConnection(headers: IncomingHttpHeaders): ReadonlySet<string> {
  return new Set(
    (single(headers.connection) ?? '')
      .split(',')
      .map((t) => t.trim().toLowerCase())
      .filter((t) => t !== ''),
  );
}

function readIdempotencyKey(
  headers: IncomingHttpHeaders,
  rawHeaders: readonly string[],
): string | undefined {
  const value = headers['idempotency-key'];
  if (value === undefined) return undefined;
  let count = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (rawHeaders[i].toLowerCase() === 'idempotency-key') count++;
  }
  const repeated = count > 1 || Array.isArray(value);
  if (repeated || !IDEMPOTENCY_KEY.test(value)) {
    throw new ForwardingException(
      OrdersErrorCode.InvalidIdempotencyKey,
      repeated
        ? 'the Idempotency-Key header is repeated; send it once'
        : 'the Idempotency-Key header must be 1-255 printable ASCII characters, e.g. a UUID',
    );
  }
  return value;
}

function isValidTraceparent(value: string): boolean {
  if (!TRACEPARENT.test(value)) return false;
  const [version, traceId, parentId] = value.split('-');
  return version !== 'ff' && !/^0+$/.test(traceId) && !/^0+$/.test(parentId);
}

/** At most a UTF-8 charset: RFC 8259 §8.1, JSON exchanged between systems is UTF-8. */
export function isJsonContentType(header: string | undefined): boolean {
  if (header === undefined) return false;
  const [type, ...params] = header.split(';');
  if (type.trim().toLowerCase() !== 'application/json') return false;
  return params.every((p) => {
    const eq = p.indexOf('=');
    const name = (eq < 0 ? p : p.slice(0, eq)).trim().toLowerCase();
    return name !== 'charset' || UTF8_CHARSET.test(p.slice(eq + 1).trim());
  });
}

/** Checks without changing it: the bytes checked are the bytes forwarded. */
export function assertJsonObject(body: Buffer | undefined): Buffer {
  if (body === undefined || body.length === 0) {
    throw invalidBody('the request body is empty; send the order as a JSON object');
  }
  if (!isUtf8(body)) throw invalidBody('the request body is not valid UTF-8');
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch (cause) {
    throw invalidBody('the request body is not valid JSON', { cause });
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw invalidBody(
      'the request body must be a JSON object (the order), not an array or a scalar',
    );
  }
  return body;
}

function invalidBody(message: string, options?: BrokerExceptionOptions): ForwardingException {
  return new ForwardingException(OrdersErrorCode.InvalidBody, message, options);
}

/**
 * Bytes rather than parsed JSON: the provider receives these bytes, so a re-serialised body
 * with keys in another order counts as a different request.
 */
export function bodyFingerprint(body: Buffer): string {
  return createHash('sha256').update(body).digest('hex');
}

/** So Redis never holds the key. */
export function idempotencyKeyHash(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

function single(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value.join(', ') : value;
}
