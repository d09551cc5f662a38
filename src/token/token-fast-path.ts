import type { IncomingMessage, ServerResponse } from 'node:http';
import { Injectable } from '@nestjs/common';
import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { callerRequestIdFrom, echoedRequestId, newRequestId } from '../http/request-id';
import { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { type TokenAnswer, type TokenQuery, TokenResponder } from './token-responder';

/**
 * `GET /token` answered straight from Node's request event, before Fastify.
 *
 * Measured here, Fastify's request pipeline (routing, hooks, reply, serialisation) cost about a
 * third of the broker's CPU per token served, which kept the hot path far from the bare
 * `node:http` baseline it is held to. What to answer comes from {@link TokenResponder}, as on
 * the Fastify route ({@link TokenRoute}); this front only parses the plain query strings callers
 * send and writes the answer. It declines ("not mine": Fastify serves the request) any target
 * but exactly `/token` with a plain query (see {@link plainQuery}), so that routing and query
 * semantics stay Fastify's.
 */
@Injectable()
export class TokenFastPath {
  /** The last answer written and its headers as a flat list (see {@link headerList}). */
  private lastAnswer?: TokenAnswer;
  private lastList: string[] = [];

  constructor(
    private readonly responder: TokenResponder,
    private readonly httpMetrics: HttpMetricsHook,
  ) {}

  /** Serves `req` if it is a plain `GET /token`; returns whether it took the request. */
  tryServe(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url;
    if (req.method !== 'GET' || url === undefined) return false;
    const query = plainQuery(url);
    if (query === undefined) return false;
    const seen = scanHeaders(req.rawHeaders);
    const ids = { reqId: newRequestId(), callerRequestId: callerRequestIdFrom(seen.requestId) };
    const answer = this.responder.respond(query, seen.authorization, ids, req);
    const echoed = echoedRequestId(ids);
    if (answer instanceof Promise) void answer.then((a) => this.write(res, a, echoed));
    else this.write(res, answer, echoed);
    return true;
  }

  private write(res: ServerResponse, answer: TokenAnswer, reqId: string): void {
    const list = this.headerList(answer);
    // The list is shared by every answer of this token and second; its last value is the
    // request id, set here and read by writeHead before anything else runs.
    list[list.length - 1] = reqId;
    res.writeHead(answer.status, list);
    res.end(answer.body);
    this.httpMetrics.requests.record('/token', 'GET', answer.status);
  }

  /**
   * `answer`'s headers as the flat name/value list `writeHead` also takes, with `x-request-id`
   * last. Why a list: given an object, Node walks it with `for...in` and an own-property check
   * per header, which measured 3-5 µs per response here (CPU per request of a bare `node:http`
   * server answering the same nine headers: 19.2-21.5 µs with the object, 15.7-17.0 µs with the
   * list, three interleaved runs of 150,000 requests); a list is read by index.
   * Kept for the last answer only: a token's 200 answer is one object for a whole second.
   */
  private headerList(answer: TokenAnswer): string[] {
    if (answer === this.lastAnswer) return this.lastList;
    const list: string[] = [];
    for (const name of Object.keys(answer.headers)) list.push(name, answer.headers[name]);
    list.push('x-request-id', '');
    this.lastAnswer = answer;
    this.lastList = list;
    return list;
  }
}

/** What {@link scanHeaders} found; reused, read at once by the caller. */
const seen: { authorization?: string; requestId?: string } = {};

/**
 * `Authorization` ({@link REPEATED_AUTHORIZATION} when repeated, as `authorizationOf` says) and
 * `X-Request-Id` (`undefined` when repeated: Node would join the values with ", ", which no
 * request id may contain) in one pass over the raw header lines.
 *
 * Why not `req.headers`: Node builds that object on first access, a lower-cased copy of every
 * header line, which measured at about 1.5 µs per request here; the bare server `GET /token`
 * is held to never builds it, and a cache hit needs only these two values.
 */
function scanHeaders(raw: readonly string[]): typeof seen {
  seen.authorization = undefined;
  seen.requestId = undefined;
  let requestIds = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    if (name.length === 13 && isName(name, 'authorization', 'Authorization')) {
      seen.authorization = seen.authorization === undefined ? raw[i + 1] : REPEATED_AUTHORIZATION;
    } else if (name.length === 12 && isName(name, 'x-request-id', 'X-Request-Id')) {
      seen.requestId = ++requestIds === 1 ? raw[i + 1] : undefined;
    }
  }
  return seen;
}

/** Whether header `name` is `lower` in any case; the two usual spellings need no lower-casing. */
function isName(name: string, lower: string, usual: string): boolean {
  return name === lower || name === usual || name.toLowerCase() === lower;
}

/**
 * The query of a request whose target is exactly `/token`, or `/token?` and a query naming
 * `client` and `min_ttl` at most once each, without escapes; `undefined` for anything else,
 * which Fastify then routes and parses. The front reads no other spelling of a target: what the
 * router makes of one (an escape, an absolute form, a dot segment) is the router's alone.
 */
function plainQuery(url: string): TokenQuery | undefined {
  if (url === '/token') return {};
  if (!url.startsWith('/token?')) return undefined;
  const search = url.slice(7);
  // Escapes are left to Fastify: its query parser and URLSearchParams decode a malformed one
  // differently, and no plain client id needs one.
  if (search.includes('%')) return undefined;
  let client: string | undefined;
  let minTtl: string | undefined;
  for (const [key, value] of new URLSearchParams(search)) {
    if (key === 'client' && client === undefined) client = value;
    else if (key === 'min_ttl' && minTtl === undefined) minTtl = value;
    else return undefined;
  }
  return { client, min_ttl: minTtl };
}
