import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { LogController } from 'fastify';
import type { Logger } from 'pino';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { AppModule } from './app.module';
import { adminPortOf, type BrokerConfig } from './config/config.schema';
import { toProblem } from './http/problem';
import { RequestErrorCode, RequestException } from './http/request.exception';
import { callerRequestIdFrom, newRequestId } from './http/request-id';
import { SECURITY_HEADERS } from './http/security-headers';
import { lazyChildLogger } from './logging/lazy-request-logger';
import { TokenFastPath } from './token/token-fast-path';
import { OrdersFastPath } from './orders/orders-fast-path';
import { DrainState } from './health/drain-state';
import { PinoNestLogger } from './logging/logger';

/** Request line plus headers; a longer query string is refused by Node's parser. */
const MAX_HEADER_BYTES = 16_384;

/**
 * Requests Node's HTTP parser refuses (oversized request line or headers, malformed HTTP) never
 * reach a route or the problem filter; Fastify's default answer is plain JSON. Answer them in
 * problem+json like every other error, then close the connection as Node would.
 */
function answerClientError(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const timedOut = err.code === 'ERR_HTTP_REQUEST_TIMEOUT';
  const detail = timedOut
    ? 'the request did not arrive in time (HTTP_HEADERS_TIMEOUT_MS for the headers, HTTP_REQUEST_TIMEOUT_MS for the whole request); the connection is closed'
    : err.code === 'HPE_HEADER_OVERFLOW'
      ? `the request line and headers exceed ${MAX_HEADER_BYTES} bytes; shorten the query string`
      : 'the request is not valid HTTP/1.1';
  const { problem } = toProblem(
    new RequestException(
      timedOut ? RequestErrorCode.RequestTimeout : RequestErrorCode.InvalidRequest,
      detail,
    ),
  );
  const body = JSON.stringify(problem);
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${problem.status} ${problem.title}\r\ncontent-type: application/problem+json\r\n` +
        `content-length: ${Buffer.byteLength(body)}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy();
}

/**
 * Builds the Nest application on Fastify, without listening. Shared by `main.ts`, the sandbox
 * and the tests, so all of them run exactly the production wiring.
 */
export async function createBrokerApp(
  config: BrokerConfig,
  logger: Logger,
): Promise<NestFastifyApplication> {
  const front: {
    tryServe?: (req: IncomingMessage, res: ServerResponse) => boolean;
    handler?: (req: IncomingMessage, res: ServerResponse) => void;
    drain?: DrainState;
  } = {};
  const adminPort = adminPortOf(config.http);
  const adminApart = adminPort !== undefined;
  const adapter = new FastifyAdapter({
    // maxHeaderSize bounds the query string too: an oversized request line is refused early.
    serverFactory: (handler: (req: IncomingMessage, res: ServerResponse) => void) => {
      front.handler = handler;
      return createServer(
        {
          maxHeaderSize: MAX_HEADER_BYTES,
          // Fastify applies none of its timeouts to a server it did not create: set Node's.
          // A client trickling its headers (slowloris) or body is cut off after these.
          headersTimeout: config.http.headersTimeoutMs,
          requestTimeout: config.http.requestTimeoutMs,
          keepAliveTimeout: config.http.keepAliveTimeoutMs,
          // How often Node checks those deadlines (its default, 30 s, would add up to that).
          connectionsCheckingInterval: Math.min(1000, config.http.headersTimeoutMs),
        },
        (req, res) => {
          if (adminApart && isAdminOnlyPath(req.url)) return notFound(req, res);
          // Draining: still answered, but the caller's keep-alive connection ends with this
          // answer, so its next request opens a connection the Service sends elsewhere.
          if (front.drain?.draining === true) res.shouldKeepAlive = false;
          if (front.tryServe?.(req, res) !== true) handler(req, res);
        },
      );
    },
    loggerInstance: logger,
    // Per-request info logs would cost more than the whole GET /token hot path; audit lines
    // are written by the features themselves.
    logController: new LogController({ disableRequestLogging: true }),
    childLoggerFactory: lazyChildLogger,
    // The broker's own id: the caller's X-Request-Id is echoed and logged beside it, never as it.
    genReqId: () => newRequestId(),
    routerOptions: { maxParamLength: 200 },
    clientErrorHandler: answerClientError,
    return503OnClosing: true,
    forceCloseConnections: 'idle',
  });
  const app = await NestFactory.create<NestFastifyApplication>(
    AppModule.forRoot(config, logger),
    adapter,
    { logger: new PinoNestLogger(logger), bufferLogs: false },
  );
  const fastify = app.getHttpAdapter().getInstance();
  fastify.addHook('onSend', (req, reply, payload, done) => {
    reply.header('x-request-id', callerRequestIdFrom(req.headers['x-request-id']) ?? req.id);
    reply.headers(SECURITY_HEADERS);
    done(null, payload);
  });
  // The GET /token cache hit and the ordinary POST /orders are answered before Fastify (see
  // TokenFastPath, OrdersFastPath); what they decline goes to Fastify's handler.
  const tokenFront = app.get(TokenFastPath);
  const ordersFront = app.get(OrdersFastPath);
  const declined = (req: IncomingMessage, res: ServerResponse) => front.handler!(req, res);
  front.tryServe = (req, res) =>
    tokenFront.tryServe(req, res) || ordersFront.tryServe(req, res, declined);
  front.drain = app.get(DrainState);
  if (adminApart) {
    // The admin listener (see `http.adminPort`): `/metrics`, `/health/*` and `/admin/*`, through
    // the same Fastify app, so a NetworkPolicy can admit operators and Prometheus here only.
    const adminServer = createServer(
      {
        maxHeaderSize: MAX_HEADER_BYTES,
        headersTimeout: config.http.headersTimeoutMs,
        requestTimeout: config.http.requestTimeoutMs,
        keepAliveTimeout: config.http.keepAliveTimeoutMs,
      },
      (req, res) => {
        if ((isAdminOnlyPath(req.url) || isHealthPath(req.url)) && front.handler) {
          front.handler(req, res);
        } else notFound(req, res);
      },
    );
    adminServer.on('clientError', answerClientError);
    fastify.addHook('onListen', (done) => {
      adminServer.once('error', done);
      adminServer.listen(adminPort, config.http.host, () => done());
    });
    fastify.addHook('preClose', (done) => {
      adminServer.close(() => done());
      adminServer.closeAllConnections();
    });
  }
  return app;
}

/** Whether `url` is `prefix` itself or below it (`/admin`, `/admin/…`, `/admin?…`). */
function under(url: string | undefined, prefix: string): boolean {
  if (url === undefined || !url.startsWith(prefix)) return false;
  const next = url.charCodeAt(prefix.length);
  // End, '/', '?': anything else is another route (`/metricsfoo`).
  return Number.isNaN(next) || next === 0x2f || next === 0x3f;
}

/** Routes served on the admin port only when it is set: the metrics and the admin routes. */
function isAdminOnlyPath(url: string | undefined): boolean {
  return under(url, '/metrics') || under(url, '/admin');
}

/** Probes: served on both ports (see `http.adminPort`). */
function isHealthPath(url: string | undefined): boolean {
  return under(url, '/health');
}

/** A 404 problem, written directly: `/metrics` and `/admin/*` on the API port, the API on the admin port. */
function notFound(req: IncomingMessage, res: ServerResponse): void {
  const reqId = newRequestId();
  const { problem } = toProblem(
    new RequestException(RequestErrorCode.NotFound, 'no such route; see the README for the API'),
    reqId,
  );
  const body = JSON.stringify(problem);
  res.writeHead(problem.status, {
    'content-type': 'application/problem+json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
    'x-request-id': callerRequestIdFrom(req.headers['x-request-id']) ?? reqId,
    ...SECURITY_HEADERS,
  });
  res.end(body);
}
