import type { ServerResponse } from 'node:http';
import { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import type { HttpAdapterHost } from '@nestjs/core';
import pino from 'pino';
import type { Caller } from '../caller-auth/caller';
import { CallerAuthException, CallerAuthErrorCode } from '../caller-auth/caller-auth.exception';
import type { CallerAuthGuard, CallerContext } from '../caller-auth/caller-auth.guard';
import type { BrokerConfig } from '../config/config.schema';
import { AuditLineWriter } from '../logging/audit-line.writer';
import type { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { OrdersFastPath } from './orders-fast-path';
import type { OrdersRoute } from './orders.route';
import type { OrderAudit, OrderReply, OrderRequest, OrdersService } from './orders.service';

// Nest 12 ships ES modules only, which Jest's CommonJS runtime cannot load; this front only
// needs decorators and class references (injection metadata) from it and from the providers
// it is given, which do nothing outside a Nest container. Their stand-ins are built below.
jest.mock('@nestjs/common', () => ({
  Injectable: () => () => undefined,
  Inject: () => () => undefined,
  HttpException: class {},
}));
jest.mock('@nestjs/core', () => ({ HttpAdapterHost: class {} }));
jest.mock('../metrics/http-metrics.hook', () => ({ HttpMetricsHook: class {} }));
jest.mock('../caller-auth/caller-auth.guard', () => ({ CallerAuthGuard: class {} }));
jest.mock('./orders.route', () => ({ OrdersRoute: class {} }));

const LIMIT = 1024;
const CALLER: Caller = { name: 'checkout', clients: '*', scopes: new Set(['forward']) };
const ORDER = Buffer.from('{"price":50000,"orderRef":"o-1"}');
const CREATED: OrderReply = {
  status: 201,
  contentType: 'application/json',
  body: Buffer.from('{"orderId":"1"}'),
  replayed: false,
};

/**
 * A real IncomingMessage (Node's own stream) with the given request line, headers and body
 * (`null`: none, and no `Content-Length`).
 */
function request(
  url: string,
  headers: Record<string, string>,
  body: Buffer | null = ORDER,
  method = 'POST',
): IncomingMessage {
  const req = new IncomingMessage(new Socket());
  req.method = method;
  req.url = url;
  const all: Record<string, string> = {
    authorization: 'Bearer k',
    'content-type': 'application/json',
    ...(body !== null && { 'content-length': String(body.length) }),
    ...headers,
  };
  for (const [name, value] of Object.entries(all)) {
    req.headers[name] = value;
    req.rawHeaders.push(name, value);
  }
  if (body !== null) {
    // As Node's parser does once the headers are read: the body follows, then its end.
    setImmediate(() => {
      req.push(body);
      req.push(null);
    });
  }
  return req;
}

/** The parts of a ServerResponse the front uses, recording what it wrote. */
function response() {
  const written: { status?: number; headers?: Record<string, string>; body?: Buffer } = {};
  let ended!: () => void;
  const done = new Promise<void>((resolve) => (ended = resolve));
  const res = {
    destroyed: false,
    writeHead: (status: number, headers: Record<string, string>) => {
      written.status = status;
      written.headers = { ...headers };
    },
    end: (body: Buffer) => {
      written.body = body;
      ended();
    },
  } as unknown as ServerResponse;
  return { res, written, done };
}

describe(OrdersFastPath.name, () => {
  let admit: jest.Mock<CallerContext | Promise<CallerContext>, unknown[]>;
  let created: OrderRequest[];
  let reply: () => Promise<OrderReply>;
  let recorded: unknown[][];
  let auditLines: Array<Record<string, unknown>>;
  let declined: jest.Mock;
  let preClose: ((done: () => void) => void) | undefined;
  let front: OrdersFastPath;

  beforeEach(() => {
    admit = jest.fn(() => ({ caller: CALLER, clientId: 'acme' }));
    created = [];
    reply = async () => CREATED;
    recorded = [];
    auditLines = [];
    declined = jest.fn();
    preClose = undefined;
    const guard = { admit } as unknown as CallerAuthGuard;
    const orders = {
      create: async (order: OrderRequest, audit: OrderAudit) => {
        created.push(order);
        audit.attempts = 1;
        audit.tokenFingerprint = 'fp-1';
        return reply();
      },
    } as unknown as OrdersService;
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => void auditLines.push(JSON.parse(line)) },
    );
    const route = { line: new AuditLineWriter(logger, 'order') } as unknown as OrdersRoute;
    const metrics = {
      requests: { record: (...args: unknown[]) => recorded.push(args) },
    } as unknown as HttpMetricsHook;
    const adapterHost = {
      httpAdapter: {
        getInstance: () => ({
          addHook: (name: string, hook: (done: () => void) => void) => {
            if (name === 'preClose') preClose = hook;
          },
        }),
      },
    } as unknown as HttpAdapterHost;
    const config = { orders: { bodyLimitBytes: LIMIT } } as unknown as BrokerConfig;
    front = new OrdersFastPath(guard, orders, route, metrics, adapterHost, config, logger);
    front.onModuleInit();
  });

  it('forwards an ordinary order and writes the provider answer, counted and audited', async () => {
    const { res, written, done } = response();
    const req = request('/orders?client=acme', { 'x-request-id': 'req-1' });
    expect(front.tryServe(req, res, declined)).toBe(true);
    await done;
    expect(admit).toHaveBeenCalledWith('Bearer k', 'acme', 'forward');
    expect(created).toHaveLength(1);
    expect(created[0].clientId).toBe('acme');
    expect(created[0].body.equals(ORDER)).toBe(true);
    expect(created[0].headers.forward).toEqual({ 'x-request-id': 'req-1' });
    expect(written.status).toBe(201);
    expect(written.headers).toEqual({
      'cache-control': 'no-store',
      'content-type': 'application/json',
      'x-request-id': 'req-1',
      'x-content-type-options': 'nosniff',
      'x-frame-options': 'DENY',
      'content-security-policy': "default-src 'none'; frame-ancestors 'none'",
      'referrer-policy': 'no-referrer',
      'content-length': String(CREATED.body.length),
    });
    expect(written.body).toBe(CREATED.body);
    expect(recorded).toEqual([['/orders', 'POST', 201]]);
    expect(auditLines).toHaveLength(1);
    expect(auditLines[0]).toMatchObject({
      msg: 'order',
      reqId: 'req-1',
      caller: 'checkout',
      client: 'acme',
      fp: 'fp-1',
      attempts: 1,
      status: 201,
      result: 'forwarded',
    });
    expect(declined).not.toHaveBeenCalled();
  });

  it('reads /orders without a query as no client named', async () => {
    const { res, done } = response();
    expect(front.tryServe(request('/orders', {}), res, declined)).toBe(true);
    await done;
    expect(admit).toHaveBeenCalledWith('Bearer k', undefined, 'forward');
  });

  it.each([
    ['another method', () => request('/orders', {}, ORDER, 'PUT')],
    ['another path', () => request('/orders/1', {})],
    ['a path that only starts alike', () => request('/ordersx', {})],
    ['an escaped client', () => request('/orders?client=ac%6De', {})],
    ['another query parameter', () => request('/orders?client=acme&x=1', {})],
    ['a query without client', () => request('/orders?x=1', {})],
    ['a chunked body', () => request('/orders', { 'transfer-encoding': 'chunked' }, null)],
    ['no Content-Length', () => request('/orders', {}, null)],
    ['an empty body', () => request('/orders', {}, Buffer.alloc(0))],
    ['a body over the limit', () => request('/orders', {}, Buffer.alloc(LIMIT + 1, 0x20))],
    ['another media type', () => request('/orders', { 'content-type': 'text/plain' })],
  ])('leaves %s to Fastify, untouched', (_what, make) => {
    const req = make();
    expect(front.tryServe(req, response().res, declined)).toBe(false);
    expect(admit).not.toHaveBeenCalled();
    expect(req.listenerCount('data')).toBe(0);
  });

  it('leaves to Fastify a caller refused at once, before reading the body', () => {
    admit.mockImplementation(() => {
      throw new CallerAuthException(CallerAuthErrorCode.Unauthenticated, 'no');
    });
    const req = request('/orders', {});
    expect(front.tryServe(req, response().res, declined)).toBe(false);
    expect(req.listenerCount('data')).toBe(0);
    expect(created).toHaveLength(0);
  });

  it('hands to Fastify a caller refused after verification, body unread', async () => {
    admit.mockImplementation(() =>
      Promise.reject(new CallerAuthException(CallerAuthErrorCode.Unauthenticated, 'no')),
    );
    const req = request('/orders', {});
    const { res, written } = response();
    expect(front.tryServe(req, res, declined)).toBe(true);
    await new Promise((r) => setImmediate(r));
    expect(declined).toHaveBeenCalledTimes(1);
    expect(declined).toHaveBeenCalledWith(req, res);
    expect(req.listenerCount('data')).toBe(0);
    expect(written.status).toBeUndefined();
    expect(created).toHaveLength(0);
  });

  it('forwards once a caller seen for the first time is verified', async () => {
    admit.mockImplementation(async () => ({ caller: CALLER, clientId: 'acme' }));
    const { res, written, done } = response();
    expect(front.tryServe(request('/orders', {}), res, declined)).toBe(true);
    await done;
    expect(written.status).toBe(201);
    expect(declined).not.toHaveBeenCalled();
  });

  it('hands a malformed Idempotency-Key to Fastify (which answers its 400), body unread', () => {
    const req = request('/orders', { 'idempotency-key': ' padded ' });
    const { res } = response();
    expect(front.tryServe(req, res, declined)).toBe(true);
    expect(declined).toHaveBeenCalledWith(req, res);
    expect(req.listenerCount('data')).toBe(0);
  });

  it('answers a body that is not JSON with the 400 problem, audited and counted', async () => {
    const { res, written, done } = response();
    front.tryServe(
      request('/orders', { 'x-request-id': 'req-2' }, Buffer.from('{nope')),
      res,
      declined,
    );
    await done;
    expect(created).toHaveLength(0);
    expect(written.status).toBe(400);
    expect(written.headers).toMatchObject({
      'content-type': 'application/problem+json; charset=utf-8',
      'cache-control': 'no-store',
      'x-request-id': 'req-2',
      'x-content-type-options': 'nosniff',
    });
    const problem = JSON.parse(written.body!.toString()) as Record<string, unknown>;
    expect(problem).toMatchObject({ status: 400, code: 'order_body_invalid', requestId: 'req-2' });
    expect(written.headers!['content-length']).toBe(String(written.body!.length));
    expect(recorded).toEqual([['/orders', 'POST', 400]]);
    expect(auditLines[0]).toMatchObject({
      reqId: 'req-2',
      caller: 'checkout',
      client: 'acme',
      attempts: 0,
      status: 400,
      result: 'order_body_invalid',
    });
  });

  it('says so on a replayed answer, and sends an empty one without a content type', async () => {
    reply = async () => ({ status: 409, body: Buffer.alloc(0), replayed: true });
    const { res, written, done } = response();
    front.tryServe(request('/orders', {}), res, declined);
    await done;
    expect(written.status).toBe(409);
    expect(written.headers!['idempotent-replayed']).toBe('true');
    expect(written.headers!['content-type']).toBeUndefined();
    expect(written.headers!['content-length']).toBe('0');
    expect(auditLines[0]).toMatchObject({ status: 409, result: 'replayed' });
  });

  it('ends the connection with an answer written once the server is closing', async () => {
    let release!: () => void;
    reply = () => new Promise((resolve) => (release = () => resolve(CREATED)));
    const { res, written, done } = response();
    front.tryServe(request('/orders', {}), res, declined);
    await new Promise((r) => setTimeout(r, 10));
    preClose!(() => undefined);
    release();
    await done;
    expect(written.headers!.connection).toBe('close');
    // And takes no new request: Fastify answers those 503.
    expect(front.tryServe(request('/orders', {}), response().res, declined)).toBe(false);
  });

  it('survives a caller that goes away mid-body: nothing sent, nothing written', async () => {
    const req = request('/orders', {}, null);
    req.headers['content-length'] = '100';
    const { res, written } = response();
    expect(front.tryServe(req, res, declined)).toBe(true);
    req.push(Buffer.from('{"price":'));
    req.destroy(new Error('aborted'));
    await new Promise((r) => setTimeout(r, 10));
    expect(created).toHaveLength(0);
    expect(written.status).toBeUndefined();
  });
});
