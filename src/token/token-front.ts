import type { IncomingMessage, ServerResponse } from 'node:http';
import { Injectable } from '@nestjs/common';
import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { callerRequestIdFrom, echoedRequestId, newRequestId } from '../http/request-id';
import { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { type TokenAnswer, type TokenQuery, TokenResponder } from './token-responder';

/**
 * `GET /token`, its only implementation: answered from Node's request event, sparing the hottest
 * route Fastify's pipeline. It takes exactly `/token`: any other spelling of a target goes to the
 * router, which has no `/token` route and answers 404.
 */
@Injectable()
export class TokenFront {
  private lastAnswer?: TokenAnswer;
  private lastList: string[] = [];

  constructor(
    private readonly responder: TokenResponder,
    private readonly httpMetrics: HttpMetricsHook,
  ) {}

  /** Returns whether it took the request. */
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
    // Shared by every answer of this token and second; the last value is the request id.
    list[list.length - 1] = reqId;
    res.writeHead(answer.status, list);
    res.end(answer.body);
    this.httpMetrics.requests.record('/token', 'GET', answer.status);
  }

  /**
   * A flat list because, given an object, Node walks it with `for...in` and an own-property check
   * per header; kept for the last answer only (one object per token and second).
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

const seen: { authorization?: string; requestId?: string } = {};

/**
 * One pass over the raw lines: `req.headers` is built on first access, a copy a cache hit does
 * not need. A repeated `X-Request-Id` is dropped: Node would join them with ", ".
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

function isName(name: string, lower: string, usual: string): boolean {
  return name === lower || name === usual || name.toLowerCase() === lower;
}

/** A parameter given twice becomes a list, which the responder refuses as ambiguous. */
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
