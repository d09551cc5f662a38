import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { Inject, Injectable } from '@nestjs/common';
import type { Logger } from 'pino';
import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from '../caller-auth/caller';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { assertScope } from '../caller-auth/caller-authorization';
import { problemAnswer } from '../http/problem';
import {
  callerRequestIdFrom,
  echoedRequestId,
  newRequestId,
  type RequestIds,
} from '../http/request-id';
import { RequestErrorCode, RequestException } from '../http/request.exception';
import { LOGGER } from '../logging/logger';
import { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { MetricsService } from '../metrics/metrics.service';
import { inCallerSpan } from '../tracing/spans';
import { DPOP_SIGNER, type DpopSigner } from '../dpop/dpop-proofs';
import { handOutBody, handOutTarget, type HandOutTarget } from './dpop-hand-out';
import { TokenAuditTrail } from './token-audit';
import { headerListOf, issuedAnswer, type TokenAnswer, tokenAnswer, tokenBody } from './token-body';
import type { TokenRecord } from './token-record';
import { TokenService } from './token.service';

export type { TokenAnswer } from './token-body';

export type TokenQuery = Readonly<Record<string, string | string[] | undefined>>;

/**
 * `GET /token`, its only implementation: answered from Node's request event, sparing the hottest
 * route Fastify's pipeline. It takes exactly `/token` (any other spelling reaches the router: 404),
 * and is synchronous when no I/O is needed, so the hot path allocates no promise.
 */
@Injectable()
export class TokenFront {
  constructor(
    private readonly tokens: TokenService,
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    private readonly metrics: MetricsService,
    private readonly audit: TokenAuditTrail,
    private readonly httpMetrics: HttpMetricsHook,
    @Inject(LOGGER) private readonly logger: Logger,
    @Inject(DPOP_SIGNER) private readonly dpop: DpopSigner,
  ) {}

  /** Returns whether it took the request. */
  tryServe(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url;
    if ((req.method !== 'GET' && req.method !== 'HEAD') || url === undefined) return false;
    const query = tokenQuery(url);
    if (query === undefined) return false;
    const seen = scanHeaders(req.rawHeaders);
    const ids = { reqId: newRequestId(), callerRequestId: callerRequestIdFrom(seen.requestId) };
    const answer = this.respond(query, seen.authorization, ids, req);
    const echoed = echoedRequestId(ids);
    if (answer instanceof Promise) void answer.then((a) => this.write(res, a, echoed));
    else this.write(res, answer, echoed);
    return true;
  }

  /**
   * Never throws: failures are answers. `req`'s headers are read only for a wait (trace
   * context): Node builds them on first access.
   */
  respond(
    query: TokenQuery,
    authorization: string | undefined,
    ids: RequestIds,
    req?: { readonly headers: IncomingHttpHeaders },
  ): TokenAnswer | Promise<TokenAnswer> {
    let caller: Caller | Promise<Caller>;
    try {
      caller = this.auth.authenticate(authorization);
    } catch (err) {
      return this.refuse(err, undefined, undefined, ids);
    }
    if (caller instanceof Promise) {
      return caller.then(
        (c) => this.serve(c, query, ids, req),
        (err: unknown) => this.refuse(err, undefined, undefined, ids),
      );
    }
    return this.serve(caller, query, ids, req);
  }

  /**
   * `POST /oauth2/token`'s answer body, for a client already resolved: the same L1 read, wait and
   * audit as `GET /token`; a DPoP client's with its one-time proof.
   */
  async tokenBodyFor(
    caller: Caller,
    clientId: string,
    ids: RequestIds,
    dpop: HandOutTarget,
  ): Promise<Buffer> {
    const client = this.tokens.clientConfig(clientId);
    const target =
      client.dpop === undefined
        ? undefined
        : handOutTarget(client, caller.scopes.has('token'), dpop);
    assertScope(caller, 'token');
    const hit = this.tokens.peek(clientId, 0);
    if (hit === undefined) this.metrics.cacheLookups.labels('l1', 'miss').inc();
    const record = hit ?? (await this.tokens.getToken(clientId, 0));
    this.audit.issued(ids, caller, clientId, record, Date.now());
    return target === undefined
      ? tokenBody(record, Date.now())
      : handOutBody(this.dpop, client, record, target, Date.now());
  }

  /**
   * Audited for either route; `unhandled` errors are logged too. A client outside the grant is
   * refused alike whether it exists or not; the audit says which.
   */
  refused(
    err: unknown,
    ids: RequestIds,
    caller: Caller | undefined,
    clientId: string | undefined,
    result: string,
    unhandled: boolean,
  ): void {
    if (unhandled) this.logger.error({ err, ...ids }, 'unhandled error');
    const hidden = err instanceof CallerAuthException ? err.audit : {};
    this.audit.refused({
      ...ids,
      caller: caller?.name,
      client: clientId ?? hidden.client,
      result,
      reason: hidden.reason,
    });
  }

  private serve(
    caller: Caller,
    query: TokenQuery,
    ids: RequestIds,
    req: { readonly headers: IncomingHttpHeaders } | undefined,
  ): TokenAnswer | Promise<TokenAnswer> {
    let clientId: string | undefined;
    try {
      // A proxy-only caller (scope "forward") never sees the token, from any route; one that
      // names a DPoP client learns where its calls go instead.
      if (!caller.scopes.has('token')) this.refuseBound(caller, query);
      assertScope(caller, 'token');
      clientId = this.tokens.resolveClient(single(query, 'client'), caller);
      const client = this.tokens.clientConfig(clientId);
      if (client.dpop !== undefined) {
        const target = handOutTarget(client, true, {
          method: single(query, 'dpop_htm'),
          url: single(query, 'dpop_htu'),
        });
        return this.handOut(caller, client.id, target, ids);
      }
      const minTtl = single(query, 'min_ttl');
      const minMs =
        minTtl === undefined ? 0 : parseMinTtl(minTtl, this.tokens.maxMinTtlSeconds) * 1000;
      const hit = this.tokens.peek(clientId, minMs);
      if (hit) return this.issue(caller, clientId, hit, ids);
      this.metrics.cacheLookups.labels('l1', 'miss').inc();
      const id = clientId;
      return inCallerSpan(req?.headers, 'GET /token (wait)', { 'token_broker.client': id }, () =>
        this.tokens
          .getToken(id, minMs)
          .then((record) => this.issue(caller, id, record, ids))
          .catch((err: unknown) => this.refuse(err, caller, id, ids)),
      );
    } catch (err) {
      return this.refuse(err, caller, clientId, ids);
    }
  }

  /** Throws `dpop_bound_token` for a DPoP client the caller may use; else nothing. */
  private refuseBound(caller: Caller, query: TokenQuery): void {
    let clientId: string;
    try {
      clientId = this.tokens.resolveClient(single(query, 'client'), caller);
    } catch {
      return;
    }
    const client = this.tokens.clientConfig(clientId);
    if (client.dpop !== undefined) handOutTarget(client, false, {});
  }

  /** Never from the answer cache: each proof is for one call. */
  private async handOut(
    caller: Caller,
    clientId: string,
    target: { method: string; url: string },
    ids: RequestIds,
  ): Promise<TokenAnswer> {
    try {
      const client = this.tokens.clientConfig(clientId);
      const record = this.tokens.peek(clientId, 0) ?? (await this.tokens.getToken(clientId, 0));
      const now = Date.now();
      const body = await handOutBody(this.dpop, client, record, target, now);
      this.audit.issued(ids, caller, clientId, record, now);
      return issuedAnswer(body);
    } catch (err) {
      return this.refuse(err, caller, clientId, ids);
    }
  }

  private issue(
    caller: Caller,
    clientId: string,
    record: TokenRecord,
    ids: RequestIds,
  ): TokenAnswer {
    const now = Date.now();
    this.audit.issued(ids, caller, clientId, record, now);
    // The body changes once a second (`expires_in`) or with the token; so does the answer.
    return tokenAnswer(record, now);
  }

  /** The problem code is the result. */
  private refuse(
    err: unknown,
    caller: Caller | undefined,
    clientId: string | undefined,
    ids: RequestIds,
  ): TokenAnswer {
    const { problem, headers, body } = problemAnswer(err, ids.reqId);
    const unhandled = problem.status >= 500 && problem.code === 'internal_error';
    this.refused(err, ids, caller, clientId, problem.code, unhandled);
    return { status: problem.status, headers, body };
  }

  private write(res: ServerResponse, answer: TokenAnswer, reqId: string): void {
    const list = answer.headerList ?? headerListOf(answer);
    // Shared by every answer of this token of one length; the last value is the request id.
    list[list.length - 1] = reqId;
    res.writeHead(answer.status, list);
    res.end(answer.body);
    this.httpMetrics.requests.record('/token', 'GET', answer.status);
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

/** A parameter given twice becomes a list, which {@link single} refuses as ambiguous. */
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

function single(query: TokenQuery, name: string): string | undefined {
  const v = query[name];
  if (Array.isArray(v)) {
    throw new RequestException(
      RequestErrorCode.InvalidRequest,
      `query parameter "${name}" is repeated; give it once`,
    );
  }
  return v === '' ? undefined : v;
}

/** At most the refresh-ahead lead: more would let a caller trigger early provider fetches. */
function parseMinTtl(value: string, maxSeconds: number): number {
  if (!/^\d{1,6}$/.test(value) || Number(value) > maxSeconds) {
    throw new RequestException(
      RequestErrorCode.InvalidRequest,
      `query parameter "min_ttl" must be a whole number of seconds from 0 to ${maxSeconds} (TOKEN_REFRESH_AHEAD_SECONDS: tokens are replaced that long before they expire); ask for ${maxSeconds} or less`,
    );
  }
  return Number(value);
}
