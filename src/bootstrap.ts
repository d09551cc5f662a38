import 'reflect-metadata';
import { NotFoundException } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import {
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  LogController,
} from 'fastify';
import type { Logger } from 'pino';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { AppModule } from './app.module';
import { type BrokerConfig, isDevelopmentEnv } from './config/config.schema';
import { adminPortOf } from './config/http.schema';
import { problemAnswer, toProblem } from './http/problem';
import { sendProblem } from './http/problem.reply';
import { arrivedOnAdminListener, markAdminConnection } from './http/listeners';
import { RequestErrorCode, RequestException } from './http/request.exception';
import { callerRequestIdFrom, newRequestId } from './http/request-id';
import { SECURITY_HEADERS } from './http/security-headers';
import { TokenErrorCode, TokenException } from './token/token.exception';
import { TokenFront } from './token/token-front';
import { DrainState } from './health/drain-state';
import { PinoNestLogger } from './logging/logger';

/** A longer query string is refused by Node's parser. */
const MAX_HEADER_BYTES = 16_384;

/**
 * Requests Node's parser refuses never reach a route: answer them in problem+json like every
 * other error (Fastify's default is plain JSON), then close the connection as Node would.
 */
function answerClientError(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const timedOut = err.code === 'ERR_HTTP_REQUEST_TIMEOUT';
  const detail = timedOut
    ? 'the request did not arrive in time (HTTP_HEADERS_TIMEOUT_MS for the headers, HTTP_REQUEST_TIMEOUT_MS for the whole request); the connection is closed'
    : err.code === 'HPE_HEADER_OVERFLOW'
      ? `the request line and headers exceed ${MAX_HEADER_BYTES} bytes; shorten the query string`
      : 'the request is not valid HTTP/1.1';
  const requestId = newRequestId();
  const { problem } = toProblem(
    new RequestException(
      timedOut ? RequestErrorCode.RequestTimeout : RequestErrorCode.InvalidRequest,
      detail,
    ),
    requestId,
  );
  const body = JSON.stringify(problem);
  let head =
    `HTTP/1.1 ${problem.status} ${problem.title}\r\ncontent-type: application/problem+json\r\n` +
    `content-length: ${Buffer.byteLength(body)}\r\ncache-control: no-store\r\nx-request-id: ${requestId}\r\n`;
  for (const [name, value] of Object.entries(SECURITY_HEADERS)) head += `${name}: ${value}\r\n`;
  if (socket.writable) socket.write(`${head}connection: close\r\n\r\n${body}`);
  socket.destroy();
}

/** Both listeners are made here, so a slow or malformed request is handled alike on either. */
function createListener(http: BrokerConfig['http'], onRequest: NodeHandler): Server {
  const server = createServer(
    {
      maxHeaderSize: MAX_HEADER_BYTES,
      // Fastify applies none of its timeouts to a server it did not create: slowloris guards.
      headersTimeout: http.headersTimeoutMs,
      requestTimeout: http.requestTimeoutMs,
      keepAliveTimeout: http.keepAliveTimeoutMs,
      // Node's default check interval, 30 s, would add up to that to each deadline.
      connectionsCheckingInterval: Math.min(1000, http.headersTimeoutMs),
    },
    onRequest,
  );
  // Fastify's own handler, added after this one, then finds the socket closed.
  server.on('clientError', answerClientError);
  return server;
}

type NodeHandler = (req: IncomingMessage, res: ServerResponse) => void;

/**
 * Shared by `main.ts`, the sandbox and the test stack, so all run the production wiring. `env`:
 * what `config` was loaded from, re-read when the configuration is reloaded.
 */
export async function createBrokerApp(
  config: BrokerConfig,
  logger: Logger,
  env?: Readonly<Record<string, string | undefined>>,
): Promise<NestFastifyApplication> {
  warnOfRiskySettings(config, logger);
  const adminPort = adminPortOf(config.http);
  // It and the app's parts it reads are all set before `listen`, so before any request arrives.
  let fastifyHandler: NodeHandler;
  const onRequest: NodeHandler = (req, res) => {
    // Draining: the keep-alive connection ends with this answer, so the next one goes elsewhere.
    if (drain.draining) res.shouldKeepAlive = false;
    if (drain.closing) return shuttingDown(req, res);
    // GET /token is answered before Fastify (see TokenFront).
    if (arrivedOnAdminListener(req.socket) || !token.tryServe(req, res)) fastifyHandler(req, res);
  };
  const adapter = createAdapter(logger, (handler) => {
    fastifyHandler = handler;
    return createListener(config.http, onRequest);
  });
  const app = await NestFactory.create<NestFastifyApplication>(
    AppModule.forRoot(config, logger, env),
    adapter,
    { logger: new PinoNestLogger(logger), bufferLogs: false },
  );
  const token = app.get(TokenFront);
  const drain = app.get(DrainState);
  const fastify = app.getHttpAdapter().getInstance();
  fastify.addHook('onSend', (req, reply, payload, done) => {
    // Also for a request that arrived before the drain (a slow order): its connection ends too.
    if (drain.draining) reply.header('connection', 'close');
    reply.header('x-request-id', callerRequestIdFrom(req.headers['x-request-id']) ?? req.id);
    reply.headers(SECURITY_HEADERS);
    done(null, payload);
  });
  fastify.addHook('preClose', async () => drain.close());
  if (adminPort !== undefined) addAdminListener(fastify, config.http, adminPort, onRequest);
  return app;
}

/** Settings that work but leave a door open: said once at start-up, by the setting's name. */
function warnOfRiskySettings(config: BrokerConfig, logger: Logger): void {
  if (!isDevelopmentEnv(config.nodeEnv) && config.http.issuer === undefined) {
    logger.warn(
      { setting: 'OAUTH_ISSUER' },
      "OAUTH_ISSUER (http.issuer) is not set: the OAuth metadata (/.well-known/oauth-authorization-server) builds its issuer and token_endpoint from each request's Host header, so a caller picks the URLs it is sent. Set it to the origin callers reach the broker at, e.g. http://token-broker.<namespace>.svc (the Helm chart sets it from its Service)",
    );
  }
}

function createAdapter(
  logger: Logger,
  serverFactory: (fastifyHandler: NodeHandler) => Server,
): FastifyAdapter {
  return new FastifyAdapter({
    serverFactory,
    loggerInstance: logger,
    // Per-request logs would cost more than the GET /token hot path; features write audit lines.
    logController: new LogController({ disableRequestLogging: true }),
    // The broker's own id: the caller's X-Request-Id is logged beside it, never as it.
    genReqId: () => newRequestId(),
    routerOptions: { maxParamLength: 200 },
    // Errors met before routing skip the app's hooks: answered here, without echoing the target.
    frameworkErrors: (err: FastifyError, req: FastifyRequest, reply: FastifyReply) => {
      void sendProblem(reply.header('x-request-id', req.id), err, req.id);
    },
    // Answered by the front (see shuttingDown), the same on both listeners.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
  });
}

/** Same Fastify app, so a NetworkPolicy can admit operators and Prometheus here only. */
function addAdminListener(
  fastify: FastifyInstance,
  http: BrokerConfig['http'],
  adminPort: number,
  onRequest: NodeHandler,
): void {
  const adminServer = createListener(http, onRequest);
  adminServer.on('connection', markAdminConnection);
  // Keyed on the route Fastify matched after decoding the target: no spelling gets around it.
  fastify.addHook('onRequest', (req, reply, done) => {
    const served = listenersOf(req.routeOptions.url);
    const on = arrivedOnAdminListener(req.raw.socket) ? 'admin' : 'api';
    if (served === 'both' || served === on) return done();
    // Answered as a route that does not exist.
    void sendProblem(reply, new NotFoundException(), req.id);
  });
  fastify.addHook('onListen', (done) => {
    adminServer.once('error', done);
    adminServer.listen(adminPort, http.host, () => done());
  });
  // Closed as Fastify closes its own listener, at the same time; the app's close waits for both.
  let adminClosed = Promise.resolve();
  fastify.addHook('preClose', async () => {
    adminClosed = new Promise((resolve) => adminServer.close(() => resolve()));
    adminServer.closeIdleConnections();
  });
  fastify.addHook('onClose', () => adminClosed);
}

/** `undefined`: no route matched, the not-found answer on either listener. */
function listenersOf(route: string | undefined): 'admin' | 'api' | 'both' {
  if (route === undefined || route.startsWith('/health/')) return 'both';
  if (route === '/metrics' || route === '/admin' || route.startsWith('/admin/')) return 'admin';
  return 'api';
}

function shuttingDown(req: IncomingMessage, res: ServerResponse): void {
  const reqId = newRequestId();
  const { headers, body } = problemAnswer(
    new TokenException(TokenErrorCode.ShuttingDown, 'the broker is shutting down; retry'),
    reqId,
  );
  res.writeHead(503, {
    ...headers,
    'x-request-id': callerRequestIdFrom(req.headers['x-request-id']) ?? reqId,
    connection: 'close',
  });
  res.end(body);
}
