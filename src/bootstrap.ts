import 'reflect-metadata';
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
import type { BrokerConfig } from './config/config.schema';
import { adminPortOf } from './config/http.schema';
import { problemAnswer, toProblem } from './http/problem';
import { sendProblem } from './http/problem.reply';
import { arrivedOnAdminListener, markAdminConnection } from './http/listeners';
import { RequestErrorCode, RequestException } from './http/request.exception';
import { callerRequestIdFrom, newRequestId } from './http/request-id';
import { SECURITY_HEADERS } from './http/security-headers';
import { lazyChildLogger } from './logging/lazy-request-logger';
import { TokenErrorCode, TokenException } from './token/token.exception';
import { TokenFront } from './token/token-front';
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

/**
 * A listener with the broker's HTTP settings. Both listeners (callers' and admin) are made here,
 * so a slow or malformed request is cut off and answered the same way on either.
 */
function createListener(
  http: BrokerConfig['http'],
  onRequest: (req: IncomingMessage, res: ServerResponse) => void,
): Server {
  const server = createServer(
    {
      maxHeaderSize: MAX_HEADER_BYTES,
      // Fastify applies none of its timeouts to a server it did not create: set Node's.
      // A client trickling its headers (slowloris) or body is cut off after these.
      headersTimeout: http.headersTimeoutMs,
      requestTimeout: http.requestTimeoutMs,
      keepAliveTimeout: http.keepAliveTimeoutMs,
      // How often Node checks those deadlines (its default, 30 s, would add up to that).
      connectionsCheckingInterval: Math.min(1000, http.headersTimeoutMs),
    },
    onRequest,
  );
  // Fastify adds its default handler to the callers' listener after this one: it then finds the
  // socket closed and does nothing.
  server.on('clientError', answerClientError);
  return server;
}

/** Where each request goes, filled in as the app is built. */
interface Front {
  fastify?: (req: IncomingMessage, res: ServerResponse) => void;
  token?: TokenFront;
  drain?: DrainState;
}

/**
 * Builds the Nest application on Fastify, without listening. Shared by `main.ts`, the sandbox
 * and the tests, so all of them run exactly the production wiring.
 */
export async function createBrokerApp(
  config: BrokerConfig,
  logger: Logger,
): Promise<NestFastifyApplication> {
  const adminPort = adminPortOf(config.http);
  const front: Front = {};
  const onRequest = frontHandler(front);
  const adapter = createAdapter(config, logger, front, onRequest);
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
  // GET /token is answered before Fastify (see TokenFront); every other request goes to
  // Fastify's handler.
  front.token = app.get(TokenFront);
  front.drain = app.get(DrainState);
  fastify.addHook('preClose', (done) => {
    front.drain?.close();
    done();
  });
  if (adminPort !== undefined) addAdminListener(fastify, config.http, adminPort, onRequest);
  return app;
}

/** Every request of both listeners starts here. */
function frontHandler(front: Front): (req: IncomingMessage, res: ServerResponse) => void {
  return (req: IncomingMessage, res: ServerResponse): void => {
    // Draining: still answered, but the caller's keep-alive connection ends with this answer,
    // so its next request opens a connection the Service sends elsewhere.
    if (front.drain?.draining === true) res.shouldKeepAlive = false;
    if (front.drain?.closing === true) return shuttingDown(req, res);
    if (arrivedOnAdminListener(req.socket) || front.token?.tryServe(req, res) !== true) {
      front.fastify!(req, res);
    }
  };
}

/** The Fastify adapter: the broker's listener, logger, request ids and early errors. */
function createAdapter(
  config: BrokerConfig,
  logger: Logger,
  front: Front,
  onRequest: (req: IncomingMessage, res: ServerResponse) => void,
): FastifyAdapter {
  return new FastifyAdapter({
    // maxHeaderSize bounds the query string too: an oversized request line is refused early.
    serverFactory: (handler: (req: IncomingMessage, res: ServerResponse) => void) => {
      front.fastify = handler;
      return createListener(config.http, onRequest);
    },
    loggerInstance: logger,
    // Per-request info logs would cost more than the whole GET /token hot path; audit lines
    // are written by the features themselves.
    logController: new LogController({ disableRequestLogging: true }),
    childLoggerFactory: lazyChildLogger,
    // The broker's own id: the caller's X-Request-Id is echoed and logged beside it, never as it.
    genReqId: () => newRequestId(),
    routerOptions: { maxParamLength: 200 },
    // Errors met before routing (a target that does not percent-decode) skip the app's hooks:
    // answered here like any other, without echoing the target.
    frameworkErrors: (err: FastifyError, req: FastifyRequest, reply: FastifyReply) => {
      void sendProblem(reply.header('x-request-id', req.id).headers(SECURITY_HEADERS), err, req.id);
    },
    // A request arriving while the server closes is answered by the front (see shuttingDown),
    // the same on both listeners.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
  });
}

/**
 * The admin listener (see `http.adminPort`): `/metrics`, `/health/*` and `/admin/*`, through
 * the same Fastify app, so a NetworkPolicy can admit operators and Prometheus here only.
 */
function addAdminListener(
  fastify: FastifyInstance,
  http: BrokerConfig['http'],
  adminPort: number,
  onRequest: (req: IncomingMessage, res: ServerResponse) => void,
): void {
  const adminServer = createListener(http, onRequest);
  adminServer.on('connection', markAdminConnection);
  // Keyed on the route Fastify matched, after it decoded the target: every spelling that
  // reaches an admin route is refused on the callers' listener, and the reverse.
  fastify.addHook('onRequest', (req, reply, done) => {
    const served = listenersOf(req.routeOptions.url);
    const on = arrivedOnAdminListener(req.raw.socket) ? 'admin' : 'api';
    if (served === 'both' || served === on) return done();
    void sendProblem(reply, notFound(), req.id);
  });
  fastify.addHook('onListen', (done) => {
    adminServer.once('error', done);
    adminServer.listen(adminPort, http.host, () => done());
  });
  // Closed as Fastify closes its own listener (`forceCloseConnections: 'idle'`), at the same
  // time: no new connections, idle ones closed, requests in flight finished; the app's close
  // waits for both.
  let adminClosed = Promise.resolve();
  fastify.addHook('preClose', (done) => {
    adminClosed = new Promise((resolve) => adminServer.close(() => resolve()));
    adminServer.closeIdleConnections();
    done();
  });
  fastify.addHook('onClose', (_instance, done) => {
    void adminClosed.then(() => done());
  });
}

/**
 * Which listener serves a route, by the route's pattern (`undefined`: no route matched, the
 * not-found answer on either): the metrics and admin routes on the admin listener only, the
 * probes on both, the callers' API on the callers' listener only.
 */
function listenersOf(route: string | undefined): 'admin' | 'api' | 'both' {
  if (route === undefined || route.startsWith('/health/')) return 'both';
  if (route === '/metrics' || route === '/admin' || route.startsWith('/admin/')) return 'admin';
  return 'api';
}

/** The answer to a request that arrives once the listeners are closing, on either. */
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

function notFound(): RequestException {
  return new RequestException(
    RequestErrorCode.NotFound,
    'no such route; see the README for the API',
  );
}
