import { Inject, Injectable, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import {
  CallerAuthGuard,
  callerContext,
  partialCallerContext,
} from '../caller-auth/caller-auth.guard';
import { BROKER_CONFIG } from '../config/config.constants';
import { type ClientConfig, FORWARD_METHODS } from '../config/client.schema';
import type { BrokerConfig } from '../config/config.schema';
import { toProblem } from '../http/problem';
import { echoedRequestId, requestIdsOf } from '../http/request-id';
import { sendProblem } from '../http/problem.reply';
import { LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import type { ForwardingAudit } from './forwarding';
import { ForwardingAuditTrail, writeForwardingAudit } from './forwarding-audit';
import { registerForwardingRoute } from './forwarding-route';
import { readOrderHeaders } from './order-request';
import { inCallerSpan } from '../tracing/spans';
import { FORWARD_RATE_LIMITER } from './forwarding.constants';
import { ForwardErrorCode, ForwardException } from './forward.exception';
import type { ForwardRateLimiter } from './forward-rate-limiter';
import { ForwardService } from './forward.service';
import {
  allowedBy,
  FORWARD_ROUTE_PREFIX,
  type ForwardTarget,
  parseForwardTarget,
} from './forward-target';

/** Caller headers the provider may see besides those orders pass (idempotency, request id, trace). */
const PASSED_HEADERS = ['content-type', 'accept', 'accept-language'] as const;

const TARGETS = new WeakMap<FastifyRequest, ForwardTarget>();

/**
 * `/provider/<client>/<provider path>?<query>`, methods GET, HEAD, POST, PUT, PATCH, DELETE:
 * the provider passthrough. Registered on Fastify in its own context like `POST /orders`, so
 * that the body arrives as bytes whatever its media type and the caller is refused before its
 * body is read. In `onRequest`, in this order: the caller (401, scope `forward` 403), the
 * target's shape (400: nothing of the path is looked at for a caller who may not forward), the
 * client (403/404 without enumeration), the client's allow-list (403), the rate limits (429).
 */
@Injectable()
export class ForwardRoute implements OnModuleInit, OnApplicationShutdown {
  /** The audit trail, with the refusals' budget. */
  private readonly trail: ForwardingAuditTrail;
  private readonly clients: ReadonlyMap<string, ClientConfig>;

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly guard: CallerAuthGuard,
    private readonly service: ForwardService,
    @Inject(FORWARD_RATE_LIMITER) private readonly limiter: ForwardRateLimiter,
    private readonly metrics: MetricsService,
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(LOGGER) logger: Logger,
  ) {
    this.trail = new ForwardingAuditTrail(
      logger.child({ audit: 'forward' }),
      'forward',
      config.audit,
    );
    this.clients = new Map(config.clients.map((c) => [c.id, c]));
  }

  onApplicationShutdown(): void {
    this.trail.close();
  }

  onModuleInit(): void {
    registerForwardingRoute(
      this.adapterHost.httpAdapter.getInstance<FastifyInstance>(),
      this.config.forward.bodyLimitBytes,
      {
        refuse: (err, req, reply) => this.refuse(this.translate(err), req, reply),
      },
      {
        method: [...FORWARD_METHODS],
        url: `${FORWARD_ROUTE_PREFIX}*`,
        exposeHeadRoute: false,
        onRequest: (req) => this.admit(req),
        handler: (req, reply) => this.handle(req, reply),
      },
    );
  }

  private async admit(req: FastifyRequest): Promise<void> {
    const { caller, clientId } = await this.guard.authorize(req, 'forward', () => {
      const parsed = parseForwardTarget(req.raw.url ?? '');
      TARGETS.set(req, parsed);
      return parsed.clientId;
    });
    const target = TARGETS.get(req);
    if (!target) throw new Error('the guard admitted a passthrough request without its path');
    const client = this.clients.get(clientId)!;
    allowedBy(client.id, client.forward.allow, req.method, target.path);
    const verdict = await this.limiter.consume(client.id, caller.name);
    if (verdict.degraded) this.metrics.forwardRateLimitFallback.inc();
    if (!verdict.allowed) {
      const seconds = Math.max(1, Math.ceil(verdict.retryAfterMs / 1000));
      throw new ForwardException(
        ForwardErrorCode.RateLimited,
        verdict.scope === 'client'
          ? `client "${client.id}" is over its passthrough rate limit (FORWARD_CLIENT_RATE_PER_SECOND, all callers together); retry after ${seconds} s`
          : `caller "${caller.name}" is over its passthrough rate limit for client "${client.id}" (FORWARD_CALLER_RATE_PER_SECOND); retry after ${seconds} s`,
        { retryAfterSeconds: seconds },
      );
    }
  }

  private async handle(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const audit: ForwardingAudit = { attempts: 0 };
    try {
      const context = callerContext(req);
      const target = TARGETS.get(req);
      if (!context || !target) throw new Error('passthrough reached its handler unadmitted');
      const passed = passedHeaders(req.headers);
      const body = req.body as Buffer | undefined;
      const headers = readOrderHeaders(
        req.headers,
        req.raw.rawHeaders,
        // The provider gets the caller's own request id when it sent one, as the caller does.
        echoedRequestId(requestIdsOf(req)),
      );
      const result = await inCallerSpan(
        req.headers,
        `${req.method} /provider/{client}/{providerPath}`,
        { 'token_broker.client': context.clientId },
        () =>
          this.service.forward(
            {
              client: this.clients.get(context.clientId)!,
              caller: context.caller.name,
              method: req.method,
              target,
              headers,
              passed,
              body: body !== undefined && body.length > 0 ? body : undefined,
            },
            audit,
          ),
      );
      const outcome = result.replayed ? 'replayed' : 'forwarded';
      this.count(req, outcome);
      this.log(req, reply, audit, { status: result.status, result: outcome });
      reply.code(result.status).headers(result.headers);
      if (result.headers['cache-control'] === undefined) reply.header('cache-control', 'no-store');
      if (result.replayed) reply.header('idempotent-replayed', 'true');
      if (req.method === 'HEAD') {
        if (!Buffer.isBuffer(result.body)) result.body.resume();
        return reply.send();
      }
      return reply.send(result.body);
    } catch (err) {
      return this.refuse(err, req, reply, audit);
    }
  }

  private refuse(
    err: unknown,
    req: FastifyRequest,
    reply: FastifyReply,
    audit: ForwardingAudit = { attempts: 0 },
  ): FastifyReply {
    const { problem } = toProblem(err);
    this.count(req, problem.code);
    this.log(req, reply, audit, { status: problem.status, result: problem.code, err });
    return sendProblem(reply, err, req.id);
  }

  /** Per client, caller and outcome; only once the guard knows both (bounded labels). */
  private count(req: FastifyRequest, outcome: string): void {
    const seen = partialCallerContext(req);
    if (seen.caller === undefined || seen.clientId === undefined) return;
    if (!this.clients.has(seen.clientId)) return;
    this.metrics.forwardRequests.labels(seen.clientId, seen.caller.name, outcome).inc();
  }

  /** The orders audit line with the method and the checked path (never the query: data). */
  private log(
    req: FastifyRequest,
    reply: FastifyReply,
    audit: ForwardingAudit,
    outcome: { status: number; result: string; err?: unknown },
  ): void {
    const path = TARGETS.get(req)?.path;
    writeForwardingAudit(this.trail, req, reply, audit, outcome, {
      method: req.method,
      path: path?.slice(0, 256),
    });
  }

  private translate(err: unknown): unknown {
    switch ((err as { code?: unknown } | null)?.code) {
      case 'FST_ERR_CTP_BODY_TOO_LARGE':
        return new ForwardException(
          ForwardErrorCode.BodyTooLarge,
          `the request body exceeds ${this.config.forward.bodyLimitBytes} bytes (FORWARD_BODY_LIMIT_BYTES)`,
          { cause: err },
        );
      default:
        return err;
    }
  }
}

/** Those of the {@link PASSED_HEADERS} the caller sent. */
function passedHeaders(headers: FastifyRequest['headers']): Record<string, string> {
  const passed: Record<string, string> = {};
  for (const name of PASSED_HEADERS) {
    const value = headers[name];
    if (typeof value === 'string') passed[name] = value;
  }
  return passed;
}
