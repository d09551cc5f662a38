import { Inject, Injectable, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { Transform } from 'node:stream';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import {
  CallerAuthGuard,
  callerContext,
  partialCallerContext,
} from '../caller-auth/caller-auth.guard';
import { assertMayForward } from '../caller-auth/caller-authorization';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { toProblem } from '../http/problem';
import { sendProblem } from '../http/problem.reply';
import { echoedRequestId, requestIdsOf } from '../http/request-id';
import { RequestErrorCode, RequestException } from '../http/request.exception';
import { auditLogger, LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import type { ProviderApiGateway } from '../provider/provider-api.client';
import { PROVIDER_API_GATEWAY } from '../provider/provider.constants';
import { TokenService } from '../token/token.service';
import { inCallerSpan } from '../tracing/spans';
import type { ForwardRateLimiter } from './forward-rate-limiter';
import { allowedBy, forwardedCall, type ForwardTarget, parseForwardTarget } from './forward-target';
import { ForwardingAuditTrail } from './forwarding-audit';
import {
  FORWARD_RATE_LIMITER,
  IDEMPOTENCY_STORE,
  ORDERS_RATE_LIMITER,
} from './forwarding.constants';
import {
  ForwardErrorCode,
  ForwardingException,
  forwardingProblem,
  type ForwardingProfile,
  OrdersErrorCode,
} from './forwarding.exception';
import { PROFILES } from './forwarding.profiles';
import { type ForwardingAudit, type ForwardReply, ForwardingService } from './forwarding.service';
import type { IdempotencyStore } from './idempotency-store';
import {
  assertJsonObject,
  isJsonContentType,
  nominatedByConnection,
  readOrderHeaders,
} from './order-request';
import { type BudgetRefusal, budgetLimits, type Hold, RequestBudgets } from './request-budgets';

/** Caller headers the passthrough lets the provider see besides idempotency, request id, trace. */
const PASSED_HEADERS = ['content-type', 'accept', 'accept-language'] as const;

/** What `POST /orders` always sends, whatever `Connection` names: its body is checked JSON. */
const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json' };

const JSON_ONLY = 'send the order as Content-Type: application/json (UTF-8)';

const TARGETS = new WeakMap<FastifyRequest, ForwardTarget>();
/** What each admitted request holds of the replica's budgets until its response closes. */
const HOLDS = new WeakMap<FastifyRequest, Hold>();

/** The budget label of the metric, per problem code a budget answers. */
const BUDGET_CODES = new Map<string, string>([
  [OrdersErrorCode.IdempotencyRecordsExceeded, 'idempotency_records'],
  [OrdersErrorCode.IdempotencyBytesExceeded, 'idempotency_bytes'],
  [OrdersErrorCode.BodyBudgetExhausted, 'body_bytes'],
  [ForwardErrorCode.BodyBudgetExhausted, 'body_bytes'],
]);

/** Each budget's settings, as the refusal names them. */
const IN_FLIGHT_SETTING: Record<ForwardingProfile, string> = {
  orders: 'ORDERS_MAX_IN_FLIGHT_PER_CALLER',
  forward: 'FORWARD_MAX_IN_FLIGHT_PER_CALLER',
};
const RATE_SETTINGS: Record<ForwardingProfile, Record<'client' | 'caller', string>> = {
  orders: { client: 'ORDERS_CLIENT_RATE_PER_SECOND', caller: 'ORDERS_CALLER_RATE_PER_SECOND' },
  forward: { client: 'FORWARD_CLIENT_RATE_PER_SECOND', caller: 'FORWARD_CALLER_RATE_PER_SECOND' },
};

/**
 * Each profile is an encapsulated Fastify context rather than a Nest controller: its raw-bytes
 * parser (the body reaches the provider byte for byte) must apply to no other route, and the
 * caller is authorised in `onRequest`, before the body is read.
 */
@Injectable()
export class ForwardingRoute implements OnModuleInit, OnApplicationShutdown {
  private readonly trails: Record<ForwardingProfile, ForwardingAuditTrail>;
  private readonly service: ForwardingService;
  private readonly budgets: RequestBudgets;
  private readonly logger: Logger;

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly guard: CallerAuthGuard,
    private readonly tokens: TokenService,
    @Inject(PROVIDER_API_GATEWAY) api: ProviderApiGateway,
    @Inject(IDEMPOTENCY_STORE) store: IdempotencyStore,
    @Inject(FORWARD_RATE_LIMITER) private readonly limiter: ForwardRateLimiter,
    @Inject(ORDERS_RATE_LIMITER) private readonly ordersLimiter: ForwardRateLimiter,
    private readonly metrics: MetricsService,
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(LOGGER) logger: Logger,
  ) {
    this.service = new ForwardingService(tokens, api, store, config, metrics, logger);
    const trail = (profile: ForwardingProfile) =>
      new ForwardingAuditTrail(auditLogger(logger, profile), PROFILES[profile].msg, config.audit);
    this.trails = { orders: trail('orders'), forward: trail('forward') };
    this.logger = logger.child({ component: 'forwarding' });
    this.budgets = new RequestBudgets(budgetLimits(config));
    metrics.setBudgetSources(
      () => ({ held: this.budgets.bodyBytes, limit: this.budgets.limits.bodyBytes }),
      (route) => this.budgets.requests(route),
    );
  }

  onApplicationShutdown(): void {
    for (const trail of Object.values(this.trails)) trail.close();
  }

  onModuleInit(): void {
    const fastify = this.adapterHost.httpAdapter.getInstance<FastifyInstance>();
    for (const profile of ['orders', 'forward'] as const) this.register(fastify, profile);
  }

  private register(fastify: FastifyInstance, profile: ForwardingProfile): void {
    const bodyLimit = PROFILES[profile].settings(this.config).bodyLimitBytes;
    void fastify.register(async (scope) => {
      scope.removeAllContentTypeParsers();
      scope.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit }, (_req, body, done) =>
        done(null, body),
      );
      scope.setErrorHandler((err: FastifyError, req, reply) =>
        this.refuse(profile, this.translate(profile, err, req), req, reply),
      );
      scope.route({
        ...PROFILES[profile].route,
        bodyLimit,
        onRequest: (req, reply) => this.admit(profile, req, reply),
        preParsing: async (req, _reply, payload) => this.metered(profile, req, payload),
        handler: (req, reply) => this.handle(profile, req, reply),
      });
    });
  }

  /**
   * Before the body is read. The target's shape is checked only after the caller may forward,
   * so nothing of the path is looked at for a caller who may not.
   */
  private async admit(
    profile: ForwardingProfile,
    req: FastifyRequest,
    reply: FastifyReply,
  ): Promise<void> {
    if (profile === 'orders') {
      const { caller, clientId } = await this.guard.authorize(req, 'forward');
      const path = this.tokens.clientConfig(clientId).ordersPath;
      assertMayForward(
        caller,
        'POST',
        path,
        `POST /orders (POST ${path} for client "${clientId}")`,
      );
      // Any media type reaches the route as bytes: refused here with a clear message.
      if (!isJsonContentType(req.headers['content-type'])) {
        throw new ForwardingException(OrdersErrorCode.UnsupportedMediaType, JSON_ONLY);
      }
      TARGETS.set(req, { clientId, path, query: '' });
      await this.budgeted(profile, clientId, caller.name, req, reply);
      return;
    }
    const { caller, clientId } = await this.guard.authorize(req, 'forward', () => {
      const parsed = parseForwardTarget(req.raw.url ?? '');
      TARGETS.set(req, parsed);
      return parsed.clientId;
    });
    const target = TARGETS.get(req);
    if (!target) throw new Error('the guard admitted a passthrough request without its path');
    const client = this.tokens.clientConfig(clientId);
    allowedBy(client.id, client.forward.allow, req.method, target.path);
    assertMayForward(caller, req.method, target.path, forwardedCall(req.method, target.path));
    await this.budgeted(profile, client.id, caller.name, req, reply);
  }

  /**
   * The rate limits, then the replica's budgets. A request refused here has not had its body
   * read: the connection is closed after the answer rather than read to its end and discarded,
   * which would cost the very memory and time the budgets protect.
   */
  private async budgeted(
    profile: ForwardingProfile,
    clientId: string,
    caller: string,
    req: FastifyRequest,
    reply: FastifyReply,
  ): Promise<void> {
    try {
      await this.limit(profile, clientId, caller);
      this.hold(profile, caller, req, reply);
    } catch (err) {
      reply.header('connection', 'close');
      throw err;
    }
  }

  /** The route's rate limits, per client and per (client, caller). */
  private async limit(profile: ForwardingProfile, clientId: string, caller: string): Promise<void> {
    const orders = profile === 'orders';
    const verdict = await (orders ? this.ordersLimiter : this.limiter).consume(clientId, caller);
    if (verdict.degraded) {
      (orders ? this.metrics.ordersRateLimitFallback : this.metrics.forwardRateLimitFallback).inc();
    }
    if (verdict.allowed) return;
    this.metrics.budgetRefusals.labels(profile, caller, `rate_${verdict.scope}`).inc();
    const seconds = Math.max(1, Math.ceil(verdict.retryAfterMs / 1000));
    const what = orders ? 'order' : 'passthrough';
    const setting = RATE_SETTINGS[profile][verdict.scope];
    throw forwardingProblem(
      profile,
      'rateLimited',
      verdict.scope === 'client'
        ? `client "${clientId}" is over its ${what} rate limit (${setting}, all callers together); retry after ${seconds} s`
        : `caller "${caller}" is over its ${what} rate limit for client "${clientId}" (${setting}); retry after ${seconds} s`,
      { retryAfterSeconds: seconds },
    );
  }

  /**
   * Takes the request's share of the replica's budgets until its response closes, whatever
   * ends it (answer, error, the caller going away). A declared body is reserved whole here,
   * before a byte of it is read; one without a length is metered as it arrives.
   */
  private hold(
    profile: ForwardingProfile,
    caller: string,
    req: FastifyRequest,
    reply: FastifyReply,
  ): void {
    const hold = this.budgets.enter(profile, caller);
    if ('kind' in hold) throw this.overBudget(profile, caller, hold);
    HOLDS.set(req, hold);
    reply.raw.once('close', () => hold.release());
    const declared = Number(req.headers['content-length'] ?? 0);
    // Past the body limit Fastify answers 413 without reading it: nothing to reserve.
    const limit = PROFILES[profile].settings(this.config).bodyLimitBytes;
    if (!Number.isSafeInteger(declared) || declared <= 0 || declared > limit) return;
    const refused = hold.reserve(declared);
    if (refused) throw this.overBudget(profile, caller, refused);
  }

  /** A body sent without `Content-Length` takes the budgets chunk by chunk, cut off past them. */
  private metered(
    profile: ForwardingProfile,
    req: FastifyRequest,
    payload: NodeJS.ReadableStream,
  ): NodeJS.ReadableStream {
    const hold = HOLDS.get(req);
    if (!hold || req.headers['content-length'] !== undefined) return payload;
    const caller = callerContext(req)?.caller.name ?? '';
    const meter = new Transform({
      transform: (chunk: Buffer, _encoding, next) => {
        const refused = hold.reserve(chunk.length);
        next(refused ? this.overBudget(profile, caller, refused) : null, chunk);
      },
    });
    payload.once('error', (err: Error) => meter.destroy(err));
    return payload.pipe(meter);
  }

  private overBudget(
    profile: ForwardingProfile,
    caller: string,
    refusal: BudgetRefusal,
  ): ForwardingException {
    const { noun } = PROFILES[profile];
    switch (refusal.kind) {
      case 'in_flight':
        this.metrics.budgetRefusals.labels(profile, caller, 'in_flight').inc();
        return forwardingProblem(
          profile,
          'callerBudget',
          `caller "${caller}" has ${refusal.max} ${noun}s in progress on this replica, the most it may (${IN_FLIGHT_SETTING[profile]}); retry after 1 s, when one has ended`,
          { retryAfterSeconds: 1 },
        );
      case 'caller_bytes':
        this.metrics.budgetRefusals.labels(profile, caller, 'caller_body_bytes').inc();
        return forwardingProblem(
          profile,
          'callerBudget',
          `caller "${caller}" holds request bodies of ${refusal.max} bytes on this replica, its share (ORDERS_BODY_BUDGET_CALLER_PERCENT of ORDERS_BODY_BUDGET_BYTES); retry after 1 s, when one has ended`,
          { retryAfterSeconds: 1 },
        );
      case 'replica_bytes':
        // Counted when the refusal is recorded: the caller is known there too.
        return forwardingProblem(
          profile,
          'bodyBudget',
          `this replica holds request bodies of ${refusal.max} bytes, as many as its memory allows (ORDERS_BODY_BUDGET_BYTES); retry after 1 s, on this replica or another`,
          { retryAfterSeconds: 1 },
        );
    }
  }

  private async handle(
    profile: ForwardingProfile,
    req: FastifyRequest,
    reply: FastifyReply,
  ): Promise<FastifyReply> {
    const audit: ForwardingAudit = { attempts: 0 };
    try {
      const context = callerContext(req);
      const target = TARGETS.get(req);
      if (!context || !target) throw new Error(`${req.url} reached its handler unadmitted`);
      const headers = readOrderHeaders(
        req.headers,
        req.raw.rawHeaders,
        // The provider gets the caller's own request id when it sent one, as the caller does.
        echoedRequestId(requestIdsOf(req)),
      );
      const raw = req.body as Buffer | undefined;
      const orders = profile === 'orders';
      const body = orders ? assertJsonObject(raw) : raw?.length ? raw : undefined;
      const result = await inCallerSpan(
        req.headers,
        PROFILES[profile].span(req.method),
        { 'token_broker.client': context.clientId },
        () =>
          this.service.forward(
            {
              profile,
              client: this.tokens.clientConfig(context.clientId),
              caller: context.caller.name,
              method: req.method,
              target,
              headers,
              passed: orders ? JSON_HEADERS : passedHeaders(req.headers),
              body,
            },
            audit,
          ),
      );
      const outcome = result.replayed ? 'replayed' : 'forwarded';
      this.record(profile, req, reply, audit, { status: result.status, result: outcome });
      return send(profile, req, reply, result);
    } catch (err) {
      return this.refuse(profile, err, req, reply, audit);
    }
  }

  private refuse(
    profile: ForwardingProfile,
    err: unknown,
    req: FastifyRequest,
    reply: FastifyReply,
    audit: ForwardingAudit = { attempts: 0 },
  ): FastifyReply {
    const { problem } = toProblem(err);
    const budget = BUDGET_CODES.get(problem.code);
    const caller = partialCallerContext(req).caller?.name;
    if (budget !== undefined && caller !== undefined) {
      this.metrics.budgetRefusals.labels(profile, caller, budget).inc();
    }
    this.record(profile, req, reply, audit, { status: problem.status, result: problem.code, err });
    return sendProblem(reply, err, req.id);
  }

  /**
   * The audit line, written once the answer is out or the caller gone: a caller that closed its
   * connection before the answer was complete is `client_closed` (with the status it was being
   * sent), not an error. The passthrough's line adds the method and checked path, never the
   * query, and counts the request once the guard knows both the caller and the client.
   */
  private record(
    profile: ForwardingProfile,
    req: FastifyRequest,
    reply: FastifyReply,
    audit: ForwardingAudit,
    outcome: { status: number; result: string; err?: unknown },
  ): void {
    const res = reply.raw;
    const settle = (delivered: boolean) => {
      if (delivered) return this.write(profile, req, reply, audit, outcome);
      this.logger.debug(
        { ...requestIdsOf(req), status: outcome.status, result: outcome.result },
        'the caller closed its connection before the answer was complete',
      );
      const gone = { status: outcome.status, result: String(RequestErrorCode.ClientClosed) };
      // What the answer would have said (`forwarded`, `replayed`, a code), when there was one.
      const undelivered = outcome.result === gone.result ? undefined : outcome.result;
      this.write(profile, req, reply, audit, gone, { undelivered });
    };
    // Called before the answer is sent. A caller gone already has no socket; otherwise the
    // response emits `close` either way, after `finish` only when the answer went out whole.
    if (res.destroyed || req.raw.socket?.destroyed) return settle(false);
    let finished = false;
    res.once('finish', () => (finished = true));
    res.once('close', () => settle(finished));
  }

  private write(
    profile: ForwardingProfile,
    req: FastifyRequest,
    reply: FastifyReply,
    audit: ForwardingAudit,
    outcome: { status: number; result: string; err?: unknown },
    extra: Record<string, string | undefined> = {},
  ): void {
    if (profile === 'orders') {
      this.trails.orders.write(req, reply, audit, outcome, extra);
      return;
    }
    const path = TARGETS.get(req)?.path.slice(0, 256);
    this.trails.forward.write(req, reply, audit, outcome, { method: req.method, path, ...extra });
    const seen = partialCallerContext(req);
    if (seen.caller === undefined || seen.clientId === undefined) return;
    if (!this.tokens.isConfigured(seen.clientId)) return;
    this.metrics.forwardRequests.labels(seen.clientId, seen.caller.name, outcome.result).inc();
  }

  private translate(profile: ForwardingProfile, err: unknown, req: FastifyRequest): unknown {
    const code = (err as { code?: unknown } | null)?.code;
    // Node's `aborted`: the caller went away while its body was read. Not the broker's fault.
    if (code === 'ECONNRESET' && req.raw.destroyed) {
      return new RequestException(
        RequestErrorCode.ClientClosed,
        'the caller closed its connection before its request arrived whole',
        { cause: err },
      );
    }
    if (code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
      const { noun, bodyLimitSetting, settings } = PROFILES[profile];
      return forwardingProblem(
        profile,
        'bodyTooLarge',
        `the ${noun} body exceeds ${settings(this.config).bodyLimitBytes} bytes (${bodyLimitSetting})`,
        { cause: err },
      );
    }
    // Anything else passes unchanged, as does the passthrough's bad Content-Length (Fastify's 400).
    if (code !== 'FST_ERR_CTP_INVALID_CONTENT_LENGTH' || profile === 'forward') return err;
    return new ForwardingException(
      OrdersErrorCode.InvalidBody,
      'the request body does not match its Content-Length',
      { cause: err },
    );
  }
}

/** Not one the caller's `Connection` names: those were meant for the broker's hop only. */
function passedHeaders(headers: FastifyRequest['headers']): Record<string, string> {
  const nominated = nominatedByConnection(headers);
  const passed: Record<string, string> = {};
  for (const name of PASSED_HEADERS) {
    const value = headers[name];
    if (typeof value === 'string' && !nominated.has(name)) passed[name] = value;
  }
  return passed;
}

/** The provider's answer, live or replayed, to the caller. */
function send(
  profile: ForwardingProfile,
  req: FastifyRequest,
  reply: FastifyReply,
  result: ForwardReply,
): FastifyReply {
  reply.code(result.status).headers(result.headers);
  if (result.headers['cache-control'] === undefined) reply.header('cache-control', 'no-store');
  if (result.replayed) reply.header('idempotent-replayed', 'true');
  if (req.method === 'HEAD') {
    if (!Buffer.isBuffer(result.body)) result.body.resume();
    return reply.send();
  }
  // An empty order answer goes without a body (and so without Fastify's octet-stream type).
  const empty = profile === 'orders' && Buffer.isBuffer(result.body) && result.body.length === 0;
  return reply.send(empty ? undefined : result.body);
}
