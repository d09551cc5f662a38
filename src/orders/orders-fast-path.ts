import type { IncomingMessage, ServerResponse } from 'node:http';
import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { authorizationOf } from '../caller-auth/bearer-credential';
import { CallerAuthGuard, type CallerContext } from '../caller-auth/caller-auth.guard';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { problemAnswer } from '../http/problem';
import { requestIdFrom } from '../http/request-id';
import { SECURITY_HEADERS } from '../http/security-headers';
import { LOGGER } from '../logging/logger';
import { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { spansEnabled } from '../tracing/spans';
import { writeForwardingAuditLine } from './forwarding-audit';
import {
  assertJsonObject,
  isJsonContentType,
  type OrderHeaders,
  readOrderHeaders,
} from './order-request';
import { OrdersRoute } from './orders.route';
import { type OrderAudit, orderOutcome, type OrderReply, OrdersService } from './orders.service';

/** What a front does with a request it declines: Fastify's handler. */
export type DeclinedHandler = (req: IncomingMessage, res: ServerResponse) => void;

/**
 * `POST /orders` answered from Node's request event, before Fastify, as {@link TokenFastPath}
 * does for `GET /token`.
 *
 * Why: when the provider answers at once, Fastify's request pipeline (routing, hooks, body
 * parsing, the reply and its `onSend` hooks) was about a quarter of the broker's CPU per order,
 * and its request and reply objects a good part of the ~31 KB allocated per order, whose
 * scavenges set the tail latency of a caller sending orders one at a time (see the README,
 * issue #17). What to do with an order is {@link OrdersService}'s, as on the Fastify route
 * ({@link OrdersRoute}); this front only reads the request and writes the answer.
 *
 * It takes only the ordinary request, decided before a byte of the body is read: `POST /orders`
 * or `/orders?client=<plain value>`, a JSON `Content-Type`, a `Content-Length` within
 * `ORDERS_BODY_LIMIT_BYTES` (not chunked), a caller admitted for the client, well-formed
 * `Idempotency-Key`, tracing off, the server not closing. Anything else, refusals included, is
 * handed to Fastify untouched, whose route answers and audits it exactly as before: the two
 * fronts differ in the transport only (`test/orders-parity.e2e-spec.ts` compares their bytes).
 */
@Injectable()
export class OrdersFastPath implements OnModuleInit {
  /** Set when Fastify starts closing (its `preClose` hook). */
  private closing = false;
  private readonly bodyLimit: number;

  constructor(
    private readonly guard: CallerAuthGuard,
    private readonly orders: OrdersService,
    private readonly route: OrdersRoute,
    private readonly httpMetrics: HttpMetricsHook,
    private readonly adapterHost: HttpAdapterHost,
    @Inject(BROKER_CONFIG) config: BrokerConfig,
    @Inject(LOGGER) private readonly logger: Logger,
  ) {
    this.bodyLimit = config.orders.bodyLimitBytes;
  }

  onModuleInit(): void {
    // Absent in a Nest application context without HTTP (a test module): never closing then.
    const adapter = this.adapterHost.httpAdapter as HttpAdapterHost['httpAdapter'] | undefined;
    adapter?.getInstance<FastifyInstance>().addHook('preClose', (done) => {
      this.closing = true;
      done();
    });
  }

  /**
   * Serves `req` if it is an ordinary `POST /orders`; returns whether it took the request. A
   * request it took may still be handed to `declined` (Fastify) while its caller is being
   * verified, before any of its body is read, when that verification refuses it.
   */
  tryServe(req: IncomingMessage, res: ServerResponse, declined: DeclinedHandler): boolean {
    if (req.method !== 'POST' || this.closing || spansEnabled()) return false;
    const url = req.url;
    if (url === undefined || !url.startsWith('/orders')) return false;
    const client = plainClientQuery(url);
    if (client === NOT_PLAIN) return false;
    const headers = req.headers;
    if (headers['transfer-encoding'] !== undefined) return false;
    const length = contentLength(headers['content-length']);
    if (length === undefined || length === 0 || length > this.bodyLimit) return false;
    if (!isJsonContentType(headers['content-type'])) return false;

    const started = performance.now();
    let admitted: CallerContext | Promise<CallerContext>;
    const reqId = requestIdFrom(headers['x-request-id']);
    try {
      admitted = this.guard.admit(authorizationOf(req), client, 'forward');
      if (admitted instanceof Promise) {
        // The caller's credential is being verified (first sight): nothing may be answered
        // or read until then. A refusal goes to Fastify, which refuses and audits it.
        admitted.then(
          (context) => this.admitted(req, res, declined, context, reqId, started),
          () => declined(req, res),
        );
        return true;
      }
    } catch {
      return false;
    }
    this.admitted(req, res, declined, admitted, reqId, started);
    return true;
  }

  /** Reads the order's headers and body, or hands the request to Fastify if they are refused. */
  private admitted(
    req: IncomingMessage,
    res: ServerResponse,
    declined: DeclinedHandler,
    context: CallerContext,
    reqId: string,
    started: number,
  ): void {
    let orderHeaders: OrderHeaders;
    try {
      orderHeaders = readOrderHeaders(req.headers, req.rawHeaders, reqId);
    } catch {
      declined(req, res);
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.once('end', () => {
      const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
      void this.forward(res, context, orderHeaders, body, reqId, started);
    });
    // The caller went away before its order was complete: nothing was sent, and there is
    // nobody to answer. Node destroys the socket; the listener keeps the error from crashing.
    req.once('error', (err) =>
      this.logger.debug({ reqId, err: err.message }, 'order request aborted before its body ended'),
    );
  }

  private async forward(
    res: ServerResponse,
    context: CallerContext,
    headers: OrderHeaders,
    body: Buffer,
    reqId: string,
    started: number,
  ): Promise<void> {
    const audit: OrderAudit = { attempts: 0 };
    const request = { reqId, caller: context.caller, clientId: context.clientId };
    let status: number;
    try {
      const result = await this.orders.create(
        {
          clientId: context.clientId,
          caller: context.caller.name,
          body: assertJsonObject(body),
          headers,
        },
        audit,
      );
      const outcome = orderOutcome(result);
      status = outcome.status;
      writeForwardingAuditLine(
        this.route.line,
        { ...request, durationMs: performance.now() - started },
        audit,
        outcome,
      );
      this.answer(res, result, reqId);
    } catch (err) {
      const { problem, headers: problemHeaders, body: payload } = problemAnswer(err, reqId);
      status = problem.status;
      if (problem.status >= 500 && problem.code === 'internal_error') {
        this.logger.error({ err, reqId }, 'unhandled error');
      }
      writeForwardingAuditLine(
        this.route.line,
        { ...request, durationMs: performance.now() - started },
        audit,
        { status: problem.status, result: problem.code, err },
      );
      this.write(res, problem.status, problemHeaders, reqId, payload);
    }
    this.httpMetrics.requests.record('/orders', 'POST', status);
  }

  /** The provider's status, content type and bytes, unchanged (as the Fastify route sends them). */
  private answer(res: ServerResponse, result: OrderReply, reqId: string): void {
    const headers: Record<string, string> = { 'cache-control': 'no-store' };
    const body = result.body;
    // Fastify's default for bytes without a type, kept so that both fronts answer alike.
    if (body.length > 0) headers['content-type'] = result.contentType ?? 'application/octet-stream';
    if (result.retryAfter !== undefined) headers['retry-after'] = result.retryAfter;
    if (result.replayed) headers['idempotent-replayed'] = 'true';
    Object.assign(headers, SECURITY_HEADERS);
    headers['content-length'] = String(body.length);
    this.write(res, result.status, headers, reqId, body);
  }

  /** Writes `headers` (all but the request id and connection management) and `body`. */
  private write(
    res: ServerResponse,
    status: number,
    headers: Readonly<Record<string, string>>,
    reqId: string,
    body: Buffer,
  ): void {
    if (res.destroyed) return;
    const all: Record<string, string> = { ...headers, 'x-request-id': reqId };
    // As the Fastify route: once the server is closing, the answer ends its connection.
    if (this.closing) all.connection = 'close';
    res.writeHead(status, all);
    res.end(body);
  }
}

/** {@link plainClientQuery}'s answer for anything but `/orders` and `/orders?client=<plain>`. */
const NOT_PLAIN = Symbol('not plain');

/**
 * The `?client=` of `/orders` or `/orders?client=<value>` (the value without escapes), undefined
 * for `/orders` itself (and an empty value, as the Fastify route reads it); {@link NOT_PLAIN}
 * for any other target, left to Fastify.
 */
function plainClientQuery(url: string): string | undefined | typeof NOT_PLAIN {
  if (url.length === 7) return undefined;
  if (!url.startsWith('?client=', 7)) return NOT_PLAIN;
  const value = url.slice(15);
  if (/[%+&=#?]/.test(value)) return NOT_PLAIN;
  return value === '' ? undefined : value;
}

/** A `Content-Length` of plain digits (Node has refused anything else already), as a number. */
function contentLength(header: string | undefined): number | undefined {
  if (header === undefined || !/^\d{1,10}$/.test(header)) return undefined;
  return Number(header);
}
