import type { IncomingMessage, ServerResponse } from 'node:http';
import { Injectable } from '@nestjs/common';
import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { callerRequestIdFrom, echoedRequestId, newRequestId } from '../http/request-id';
import { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { type TokenAnswer, type TokenQuery, TokenResponder } from './token-responder';

/**
 * `GET /token`, its only implementation: answered straight from Node's request event, before
 * Fastify, whose request pipeline costs about a third of the CPU per token served. What to
 * answer comes from {@link TokenResponder}; this front parses the query and writes the answer.
 * It takes the path exactly `/token` and nothing else (see {@link tokenQuery}): any other
 * spelling of a target is the router's, which has no `/token` route and answers 404.
 */
@Injectable()
export class TokenFront {
  /** The last answer written and its headers as a flat list (see {@link headerList}). */
  private lastAnswer?: TokenAnswer;
  private lastList: string[] = [];

  constructor(
    private readonly responder: TokenResponder,
    private readonly httpMetrics: HttpMetricsHook,
  ) {}

  /** Serves `req` if it is `GET` (or `HEAD`) `/token`; returns whether it took the request. */
  tryServe(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url;
    if ((req.method !== 'GET' && req.method !== 'HEAD') || url === undefined) return false;
    const query = tokenQuery(url);
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
   * per header, a few microseconds a response; a list is read by index.
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
 * header line; the bare server `GET /token` is held to never builds it, and a cache hit needs
 * only these two values.
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
 * The query of a request whose path is exactly `/token`, decoded as `URLSearchParams` does
 * (a parameter given twice becomes a list, which the responder refuses as ambiguous);
 * `undefined` for any other target, which the router then answers.
 */
function tokenQuery(url: string): TokenQuery | undefined {
  if (url === '/token') return {};
  if (!url.startsWith('/token?')) return undefined;
  const query: Record<string, string | string[]> = {};
  for (const [key, value] of new URLSearchParams(url.slice(7))) {
    const seen = query[key];
    if (seen === undefined) query[key] = value;
    else query[key] = Array.isArray(seen) ? [...seen, value] : [seen, value];
  }
  return query;
}
