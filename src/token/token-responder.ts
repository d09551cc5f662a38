import type { IncomingHttpHeaders } from 'node:http';
import { Inject, Injectable } from '@nestjs/common';
import type { Logger } from 'pino';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from '../caller-auth/caller';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { assertMayUse, assertScope } from '../caller-auth/caller-authorization';
import { problemAnswer } from '../http/problem';
import type { RequestIds } from '../http/request-id';
import { RequestErrorCode, RequestException } from '../http/request.exception';
import { LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import { TokenAuditTrail } from './token-audit';
import { TOKEN_HEADERS, tokenBody } from './token-body';
import type { TokenRecord } from './token-record';
import { TokenService } from './token.service';
import { inCallerSpan } from '../tracing/spans';

export type TokenQuery = Readonly<Record<string, string | string[] | undefined>>;

/** A 200 answer is shared by every request served the same token and second: never mutate one. */
export interface TokenAnswer {
  readonly status: number;
  /** Every header but `x-request-id`, `date` and connection management. */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Buffer;
}

/**
 * `GET /token`, once: admission, query, L1 read or bounded wait, audit and answer. Synchronous
 * when no I/O is needed, so the hot path allocates no promise; never throws: failures are answers.
 */
@Injectable()
export class TokenResponder {
  constructor(
    private readonly tokens: TokenService,
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    private readonly metrics: MetricsService,
    private readonly audit: TokenAuditTrail,
    @Inject(LOGGER) private readonly logger: Logger,
  ) {}

  private lastIssued: TokenAnswer = issuedAnswer(Buffer.alloc(0));

  /** `req`'s headers are read only for a wait (trace context): Node builds them on first access. */
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

  /** `POST /oauth2/token`: same L1 read, wait and audit as `GET /token`. */
  async tokenFor(caller: Caller, clientId: string, ids: RequestIds): Promise<TokenRecord> {
    assertScope(caller, 'token');
    assertMayUse(caller, clientId);
    const hit = this.tokens.peek(clientId, 0);
    if (hit === undefined) this.metrics.cacheLookups.labels(clientId, 'l1', 'miss').inc();
    const record = hit ?? (await this.tokens.getToken(clientId, 0));
    this.audit.issued(ids, caller, clientId, record, Date.now());
    return record;
  }

  /** A client outside the grant is refused alike whether it exists or not; the audit says which. */
  auditRefused(
    ids: RequestIds,
    err: unknown,
    caller: Caller | undefined,
    clientId: string | undefined,
    result: string,
  ): void {
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
      // A proxy-only caller (scope "forward") never sees the token, from any route.
      assertScope(caller, 'token');
      clientId = this.tokens.resolveClient(single(query, 'client'), caller);
      const minTtl = single(query, 'min_ttl');
      const minMs =
        minTtl === undefined ? 0 : parseMinTtl(minTtl, this.tokens.maxMinTtlSeconds) * 1000;
      const hit = this.tokens.peek(clientId, minMs);
      if (hit) return this.issue(caller, clientId, hit, ids);
      this.metrics.cacheLookups.labels(clientId, 'l1', 'miss').inc();
      const id = clientId;
      return inCallerSpan(req?.headers, 'GET /token (wait)', { 'token_broker.client': id }, () =>
        this.wait(caller, id, minMs, ids),
      );
    } catch (err) {
      return this.refuse(err, caller, clientId, ids);
    }
  }

  private async wait(
    caller: Caller,
    clientId: string,
    minMs: number,
    ids: RequestIds,
  ): Promise<TokenAnswer> {
    try {
      return this.issue(caller, clientId, await this.tokens.getToken(clientId, minMs), ids);
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
    const body = tokenBody(record, now);
    // The body changes once a second (`expires_in`) or with the token; so does the answer.
    if (this.lastIssued.body !== body) this.lastIssued = issuedAnswer(body);
    return this.lastIssued;
  }

  /** Audited; the problem code is the result. */
  private refuse(
    err: unknown,
    caller: Caller | undefined,
    clientId: string | undefined,
    ids: RequestIds,
  ): TokenAnswer {
    const { problem, headers, body } = problemAnswer(err, ids.reqId);
    if (problem.status >= 500 && problem.code === 'internal_error') {
      this.logger.error({ err, ...ids }, 'unhandled error');
    }
    this.auditRefused(ids, err, caller, clientId, problem.code);
    return { status: problem.status, headers, body };
  }
}

/** The same for every caller served `body`. */
function issuedAnswer(body: Buffer): TokenAnswer {
  return {
    status: 200,
    headers: { ...TOKEN_HEADERS, 'content-length': String(body.length) },
    body,
  };
}

/** A repeated parameter is ambiguous and refused. */
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
