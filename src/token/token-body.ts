import { SECURITY_HEADERS } from '../http/security-headers';
import type { TokenRecord } from './token-record';

/** RFC 6749 §5.1: token answers are never cached. Shared by `GET /token` and OAuth answers. */
export const TOKEN_HEADERS: Readonly<Record<string, string>> = {
  'content-type': 'application/json; charset=utf-8',
  'cache-control': 'no-store',
  pragma: 'no-cache',
  ...SECURITY_HEADERS,
};

/** An HTTP answer of `GET /token`: the same object for every caller served the same bytes. */
export interface TokenAnswer {
  readonly status: number;
  /** Every header but `x-request-id`, `date` and connection management. */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Buffer;
  /**
   * `headers` as Node's flat list plus an `x-request-id` slot, kept by answers that serve many
   * requests (given an object, Node walks it with `for...in` and an own-property check per header).
   */
  readonly headerList?: string[];
}

/**
 * Built by hand: `access_token` is a validated b64token, so needs no escaping, and is ASCII, so
 * latin1 encodes it as UTF-8 would, at a copy's cost. Built once per second per token and shared
 * by every response in it (never mutated); each client's token keeps its own, so callers spread
 * over many clients do not rebuild it per request, and the second's rebuild only joins three
 * strings: the rest of the body is the token's, made once.
 */
export function tokenBody(record: TokenRecord, now: number): Buffer {
  return kept(record, now).bytes;
}

/** The `GET /token` answer of `record` at `now`: rebuilt with its body, once a second. */
export function tokenAnswer(record: TokenRecord, now: number): TokenAnswer {
  const k = kept(record, now);
  const previous = k.answer;
  if (previous?.body === k.bytes) return previous;
  return (k.answer = issuedAnswer(k.bytes, previous));
}

/**
 * The same for every caller served `body`. Its headers differ from the `previous` second's only
 * when the length does (`expires_in` loses a digit), so they are mostly that answer's own.
 */
export function issuedAnswer(body: Buffer, previous?: TokenAnswer): TokenAnswer {
  if (previous !== undefined && previous.body.length === body.length) {
    return { status: 200, headers: previous.headers, body, headerList: previous.headerList };
  }
  const headers = { ...TOKEN_HEADERS, 'content-length': String(body.length) };
  return { status: 200, headers, body, headerList: headerListOf({ headers }) };
}

/** Node's flat list of `answer.headers`, with an `x-request-id` slot last. */
export function headerListOf(answer: Pick<TokenAnswer, 'headers'>): string[] {
  const list: string[] = [];
  for (const name of Object.keys(answer.headers)) list.push(name, answer.headers[name]);
  list.push('x-request-id', '');
  return list;
}

interface Kept {
  readonly head: string;
  readonly tail: string;
  expiresIn: number;
  bytes: Buffer;
  /** The answer last built from this token's body (its headers outlive a second). */
  answer?: TokenAnswer;
}

/** One entry per token, found with one lookup per request whether body or answer is asked. */
function kept(record: TokenRecord, now: number): Kept {
  // Rounded down: a caller never believes in time it does not have.
  const expiresIn = Math.max(0, Math.floor((record.expiresAt - now) / 1000));
  let k = bodies.get(record);
  if (k === undefined) {
    k = {
      head: `{"access_token":"${record.accessToken}","token_type":"Bearer","expires_in":`,
      tail: `,"expires_at":"${new Date(record.expiresAt).toISOString()}"}`,
      expiresIn: -1,
      bytes: EMPTY,
    };
    bodies.set(record, k);
  }
  if (k.expiresIn !== expiresIn) {
    k.bytes = Buffer.from(k.head + expiresIn + k.tail, 'latin1');
    k.expiresIn = expiresIn;
  }
  return k;
}

const EMPTY = Buffer.alloc(0);

/** Gone with the record it belongs to: a replaced token takes its body and answer with it. */
const bodies = new WeakMap<TokenRecord, Kept>();
