import { Inject, Injectable, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { CallerAuthGuard, callerContext } from '../caller-auth/caller-auth.guard';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { toProblem } from '../http/problem';
import { sendProblem } from '../http/problem.reply';
import { LOGGER } from '../logging/logger';
import { assertJsonObject, isJsonContentType, readOrderHeaders } from './order-request';
import { ForwardingAuditTrail, writeForwardingAudit } from './forwarding-audit';
import { registerForwardingRoute } from './forwarding-route';
import { type OrderAudit, orderOutcome, type OrderReply, OrdersService } from './orders.service';
import { OrdersErrorCode, OrdersException } from './orders.exception';
import { inCallerSpan } from '../tracing/spans';
import { echoedRequestId, requestIdsOf } from '../http/request-id';

/**
 * `POST /orders`, registered on Fastify in its own encapsulated context rather than as a Nest
 * controller (see {@link registerForwardingRoute}): the body reaches the provider byte for byte
 * (JSON is still checked, never re-serialised), and the caller is authenticated in `onRequest`,
 * before its body (up to `orders.bodyLimitBytes`) is read. Errors, including Fastify's own (body
 * too large), become problem+json here.
 */
@Injectable()
export class OrdersRoute implements OnModuleInit, OnApplicationShutdown {
  /**
   * One line per order (caller, client, token fingerprint, never the token, outcome), and the
   * refusals' budget.
   */
  private readonly trail: ForwardingAuditTrail;

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly guard: CallerAuthGuard,
    private readonly orders: OrdersService,
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(LOGGER) logger: Logger,
  ) {
    this.trail = new ForwardingAuditTrail(logger.child({ audit: 'orders' }), 'order', config.audit);
  }

  onApplicationShutdown(): void {
    this.trail.close();
  }

  onModuleInit(): void {
    registerForwardingRoute(
      this.adapterHost.httpAdapter.getInstance<FastifyInstance>(),
      this.config.orders.bodyLimitBytes,
      {
        refuse: (err, req, reply) => this.refuse(this.translate(err), req, reply),
      },
      {
        method: 'POST',
        url: '/orders',
        // Any media type reaches the route as bytes; `admit` decides 415 with a clear message.
        onRequest: (req) => this.admit(req),
        handler: (req, reply) => this.handle(req, reply),
      },
    );
  }

  /** Before the body is read: who is calling (401/403/404), and is it JSON (415). */
  private async admit(req: FastifyRequest): Promise<void> {
    await this.guard.authorize(req, 'forward');
    if (!isJsonContentType(req.headers['content-type'])) {
      throw new OrdersException(
        OrdersErrorCode.UnsupportedMediaType,
        'send the order as Content-Type: application/json (UTF-8)',
      );
    }
  }

  private async handle(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const audit: OrderAudit = { attempts: 0 };
    try {
      const context = callerContext(req);
      if (!context) throw new Error('POST /orders reached its handler without caller context');
      const headers = readOrderHeaders(
        req.headers,
        req.raw.rawHeaders,
        // The provider gets the caller's own request id when it sent one, as the caller does.
        echoedRequestId(requestIdsOf(req)),
      );
      const body = assertJsonObject(req.body as Buffer | undefined);
      const clientId = context.clientId;
      const result = await inCallerSpan(
        req.headers,
        'POST /orders',
        { 'token_broker.client': clientId },
        () => this.orders.create({ clientId, caller: context.caller.name, body, headers }, audit),
      );
      writeForwardingAudit(this.trail, req, reply, audit, orderOutcome(result));
      return send(reply, result);
    } catch (err) {
      return this.refuse(err, req, reply, audit);
    }
  }

  /** Audits and answers a request the broker refused or could not complete. */
  private refuse(
    err: unknown,
    req: FastifyRequest,
    reply: FastifyReply,
    audit: OrderAudit = { attempts: 0 },
  ): FastifyReply {
    const { problem } = toProblem(err);
    writeForwardingAudit(this.trail, req, reply, audit, {
      status: problem.status,
      result: problem.code,
      err,
    });
    return sendProblem(reply, err, req.id);
  }

  /** Fastify's own body errors, in the orders vocabulary. */
  private translate(err: unknown): unknown {
    switch ((err as { code?: unknown } | null)?.code) {
      case 'FST_ERR_CTP_BODY_TOO_LARGE':
        return new OrdersException(
          OrdersErrorCode.BodyTooLarge,
          `the order body exceeds ${this.config.orders.bodyLimitBytes} bytes (ORDERS_BODY_LIMIT_BYTES)`,
          { cause: err },
        );
      case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
        return new OrdersException(
          OrdersErrorCode.UnsupportedMediaType,
          'send the order as Content-Type: application/json (UTF-8)',
          { cause: err },
        );
      case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
        return new OrdersException(
          OrdersErrorCode.InvalidBody,
          'the request body does not match its Content-Length',
          { cause: err },
        );
      default:
        return err;
    }
  }
}

/** The provider's status, content type and bytes, unchanged. */
function send(reply: FastifyReply, result: OrderReply): FastifyReply {
  reply.code(result.status).header('cache-control', 'no-store');
  if (result.contentType !== undefined) reply.header('content-type', result.contentType);
  if (result.retryAfter !== undefined) reply.header('retry-after', result.retryAfter);
  if (result.replayed) reply.header('idempotent-replayed', 'true');
  return reply.send(result.body.length > 0 ? result.body : undefined);
}
