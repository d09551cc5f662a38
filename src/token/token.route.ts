import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from '../caller-auth/caller';
import { assertMayUse } from '../caller-auth/caller-authorization';
import { toProblem } from '../http/problem';
import { sendProblem } from '../http/problem.reply';
import { RequestErrorCode, RequestException } from '../http/request.exception';
import { AuditLineWriter } from '../logging/audit-line.writer';
import { FLAT_REDACT_PATHS, LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import type { ClientTokenManager } from './client-token-manager';
import type { TokenRecord } from './token-record';
import { TokenService } from './token.service';

/** The largest `min_ttl` accepted: a day, the longest lifetime the broker believes. */
export const MAX_MIN_TTL_SECONDS = 86_400;

const tokenResponseSchema = {
  type: 'object',
  properties: {
    access_token: { type: 'string' },
    token_type: { type: 'string' },
    expires_in: { type: 'integer' },
    expires_at: { type: 'string' },
  },
  required: ['access_token', 'token_type', 'expires_in', 'expires_at'],
} as const;

type TokenQuery = Record<string, string | string[] | undefined>;

/**
 * `GET /token`, the hot path. Registered directly on Fastify rather than as a Nest controller:
 * measured on this service, Nest's per-request pipeline cost ~10% of throughput against a bare
 * `node:http` server, and this route must stay within 0.85x of it (see `npm run bench`). It is
 * still a Nest provider: the token service and authenticator are injected as usual, errors go
 * through the same problem mapping, and nothing here does I/O when the token is in memory.
 */
@Injectable()
export class TokenRoute implements OnModuleInit {
  /**
   * One line per token handed out or refused: caller, client, token fingerprint (never the
   * token), result. Refusals go through this child logger; the far more frequent "issued" line
   * through {@link issuedLine}, in the same format.
   */
  private readonly audit: Logger;
  /**
   * The "token issued" line, the one written per request: its fields but the request id are
   * fixed per caller, client and token, so they are serialised once (see {@link AuditLineWriter}).
   */
  private readonly issuedLine: AuditLineWriter;
  private readonly issuedFields = new WeakMap<
    Caller,
    { clientId: string; record: TokenRecord; fields: string }
  >();

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly tokens: TokenService,
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    private readonly metrics: MetricsService,
    @Inject(LOGGER) logger: Logger,
  ) {
    // Audit records are flat with known fields, so the cheap top-level redaction suffices.
    this.audit = logger.child(
      { audit: 'token' },
      { redact: { paths: FLAT_REDACT_PATHS, censor: '[redacted]' } },
    );
    this.issuedLine = new AuditLineWriter(this.audit, 'token issued');
  }

  onModuleInit(): void {
    const fastify = this.adapterHost.httpAdapter.getInstance<FastifyInstance>();
    fastify.route({
      method: 'GET',
      url: '/token',
      schema: { response: { 200: tokenResponseSchema } },
      handler: (req, reply) => this.handle(req, reply),
    });
  }

  private handle(req: FastifyRequest, reply: FastifyReply): FastifyReply | Promise<FastifyReply> {
    try {
      const caller = this.auth.authenticate(req.headers.authorization);
      if (caller instanceof Promise) {
        return caller.then(
          (c) => this.serve(c, req, reply),
          (err: unknown) => this.refuse(err, undefined, undefined, req, reply),
        );
      }
      return this.serve(caller, req, reply);
    } catch (err) {
      return this.refuse(err, undefined, undefined, req, reply);
    }
  }

  private serve(
    caller: Caller,
    req: FastifyRequest,
    reply: FastifyReply,
  ): FastifyReply | Promise<FastifyReply> {
    let clientId: string | undefined;
    try {
      const query = req.query as TokenQuery;
      const manager = this.tokens.manager(single(query, 'client'));
      clientId = manager.client.id;
      assertMayUse(caller, clientId);
      const minMs = parseMinTtl(single(query, 'min_ttl')) * 1000;
      const hit = manager.peek(minMs);
      if (hit) {
        manager.l1Hits.count++;
        return this.issue(caller, clientId, hit, req, reply);
      }
      this.metrics.cacheLookups.labels(manager.client.id, 'l1', 'miss').inc();
      return this.wait(caller, manager, minMs, req, reply);
    } catch (err) {
      return this.refuse(err, caller, clientId, req, reply);
    }
  }

  private async wait(
    caller: Caller,
    manager: ClientTokenManager,
    minMs: number,
    req: FastifyRequest,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    try {
      return this.issue(caller, manager.client.id, await manager.get(minMs), req, reply);
    } catch (err) {
      return this.refuse(err, caller, manager.client.id, req, reply);
    }
  }

  private issue(
    caller: Caller,
    clientId: string,
    record: TokenRecord,
    req: FastifyRequest,
    reply: FastifyReply,
  ): FastifyReply {
    this.auditIssued(req.id, caller, clientId, record);
    return send(reply, record);
  }

  /** The audit line for a token handed out; shared with {@link TokenFastPath}. */
  auditIssued(reqId: string, caller: Caller, clientId: string, record: TokenRecord): void {
    if (!this.issuedLine.enabled) return;
    let fixed = this.issuedFields.get(caller);
    if (fixed === undefined || fixed.record !== record || fixed.clientId !== clientId) {
      fixed = {
        clientId,
        record,
        fields:
          AuditLineWriter.field('caller', caller.name) +
          AuditLineWriter.field('client', clientId) +
          AuditLineWriter.field('fp', record.fingerprint) +
          AuditLineWriter.field('result', 'issued'),
      };
      this.issuedFields.set(caller, fixed);
    }
    this.issuedLine.write(AuditLineWriter.field('reqId', reqId) + fixed.fields);
  }

  /** Audits a refusal (the problem code is the result; the client only once it is validated). */
  private refuse(
    err: unknown,
    caller: Caller | undefined,
    clientId: string | undefined,
    req: FastifyRequest,
    reply: FastifyReply,
  ): FastifyReply {
    this.audit.info(
      {
        reqId: req.id,
        caller: caller?.name,
        client: clientId,
        result: toProblem(err).problem.code,
      },
      'token refused',
    );
    return sendProblem(reply, err, req.id);
  }
}

function send(reply: FastifyReply, record: TokenRecord): FastifyReply {
  const now = Date.now();
  return reply
    .header('cache-control', 'no-store')
    .header('pragma', 'no-cache')
    .send({
      access_token: record.accessToken,
      token_type: 'Bearer',
      // Remaining lifetime, rounded down so a caller never believes in time it does not have.
      expires_in: Math.max(0, Math.floor((record.expiresAt - now) / 1000)),
      expires_at: new Date(record.expiresAt).toISOString(),
    });
}

/** A query parameter given at most once; a repeated one is ambiguous and refused. */
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

export function parseMinTtl(value: string | undefined): number {
  if (value === undefined) return 0;
  if (!/^\d{1,6}$/.test(value) || Number(value) > MAX_MIN_TTL_SECONDS) {
    throw new RequestException(
      RequestErrorCode.InvalidRequest,
      `query parameter "min_ttl" must be a whole number of seconds from 0 to ${MAX_MIN_TTL_SECONDS}`,
    );
  }
  return Number(value);
}
