import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { testClient } from '../../test/support/test-config';
import { ordersSettingsSchema } from '../config/provider.schema';
import { type ApiOutcome, createCheckoutAgent, ProviderApiClient } from './provider-api.client';
import { ProviderErrorCode } from './provider.exception';
import { Agent } from 'undici';
import { waitFor } from '../../test/support/wait';

/**
 * The provider client as `POST /orders` calls it (fixed JSON target, answer collected whole)
 * against a real HTTP server on loopback, one behaviour per test.
 */
describe(`${ProviderApiClient.name} for orders`, () => {
  const settings = ordersSettingsSchema.parse({
    connectTimeoutMs: 500,
    headersTimeoutMs: 300,
    bodyTimeoutMs: 300,
    maxResponseBytes: 2048,
  });
  let server: Server;
  let sockets: Set<Socket>;
  let handler: (req: IncomingMessage, body: Buffer, res: ServerResponse) => void;
  let checkout: ProviderApiClient;
  let baseUrl: string;

  beforeEach(async () => {
    sockets = new Set();
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => handler(req, Buffer.concat(chunks), res));
    });
    server.on('connection', (s) => {
      sockets.add(s);
      s.once('close', () => sockets.delete(s));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    checkout = new ProviderApiClient(createCheckoutAgent(settings), settings);
  });

  afterEach(async () => {
    await checkout.close();
    for (const s of sockets) s.destroy();
    await new Promise((resolve) => server.close(resolve));
  });

  const order = (
    base = baseUrl,
    body = Buffer.from('{"price":100}'),
    via = checkout,
  ): Promise<ApiOutcome> =>
    via.call({
      client: testClient({ authUrl: base, baseUrl: base }),
      accessToken: 'provider-token',
      method: 'POST',
      target: '/api/flexpay/v1/orders',
      body,
      headers: {
        'content-type': 'application/json',
        accept: 'application/json',
        'idempotency-key': 'k-1',
        'x-request-id': 'r-1',
      },
      maxResponseBytes: settings.maxResponseBytes,
      limitSetting: 'ORDERS_MAX_RESPONSE_BYTES',
      whole: true,
    });

  it("sends the provider's create-order request, returns the answer's status, type, bytes", async () => {
    let seen: {
      method?: string;
      url?: string;
      headers?: IncomingMessage['headers'];
      body?: string;
    } = {};
    handler = (req, body, res) => {
      seen = { method: req.method, url: req.url, headers: req.headers, body: body.toString() };
      res.writeHead(422, { 'content-type': 'application/json; charset=utf-8', 'retry-after': '7' });
      res.end('{"errorCodes":["MIN_PRICE"]}');
    };
    const outcome = await order();
    expect(seen).toMatchObject({
      method: 'POST',
      url: '/api/flexpay/v1/orders',
      body: '{"price":100}',
      headers: expect.objectContaining({
        'content-type': 'application/json',
        accept: 'application/json',
        authorization: 'Bearer provider-token',
        'idempotency-key': 'k-1',
        'x-request-id': 'r-1',
      }) as unknown,
    });
    expect(outcome).toMatchObject({
      kind: 'answered',
      status: 422,
      headers: { 'content-type': 'application/json; charset=utf-8', 'retry-after': '7' },
      body: Buffer.from('{"errorCodes":["MIN_PRICE"]}'),
    });
  });

  it('collects an answer that arrives in many chunks', async () => {
    const parts = Array.from({ length: 20 }, (_, i) => `"p${i}":${'1'.repeat(40)}`);
    handler = (_req, _body, res) => {
      res.writeHead(201, { 'content-type': 'application/json' });
      let i = 0;
      const next = (): void => {
        if (i === parts.length) {
          res.end('}');
          return;
        }
        res.write(`${i === 0 ? '{' : ','}${parts[i++]}`);
        setImmediate(next);
      };
      next();
    };
    const outcome = await order();
    expect(outcome.kind).toBe('answered');
    const body = (outcome as { body: Buffer }).body.toString();
    expect(body).toBe(`{${parts.join(',')}}`);
  });

  it('refuses an answer over ORDERS_MAX_RESPONSE_BYTES: delivered maybe, malformed response', async () => {
    handler = (_req, _body, res) => {
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end(`{"x":"${'y'.repeat(5000)}"}`);
    };
    const outcome = await order();
    expect(outcome).toMatchObject({
      kind: 'failed',
      delivered: 'maybe',
      error: { code: ProviderErrorCode.MalformedResponse },
    });
    expect((outcome as { error: Error }).error.message).toMatch(/ORDERS_MAX_RESPONSE_BYTES/);
  });

  it('reports a refused connection as never delivered', async () => {
    const closed = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    for (const s of sockets) s.destroy();
    await new Promise((resolve) => server.close(resolve));
    const outcome = await order(closed);
    expect(outcome).toMatchObject({
      kind: 'failed',
      delivered: 'no',
      error: { code: ProviderErrorCode.Unreachable },
    });
    server = createServer(); // for afterEach
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  });

  it('reports no answer in time as a timeout that may have been delivered', async () => {
    handler = () => undefined; // never answers
    const outcome = await order();
    expect(outcome).toMatchObject({
      kind: 'failed',
      delivered: 'maybe',
      error: { code: ProviderErrorCode.Timeout },
    });
  });

  it('relays a redirect, never follows it: the other server receives nothing', async () => {
    let elsewhereSeen = 0;
    const elsewhere = createServer((_req, res) => {
      elsewhereSeen++;
      res.end('{}');
    });
    await new Promise<void>((resolve) => elsewhere.listen(0, '127.0.0.1', resolve));
    const port = (elsewhere.address() as AddressInfo).port;
    handler = (_req, _body, res) => {
      res.writeHead(307, { location: `http://127.0.0.1:${port}/api/flexpay/v1/orders` });
      res.end();
    };
    try {
      expect(await order()).toMatchObject({ kind: 'answered', status: 307 });
      expect(elsewhereSeen).toBe(0);
    } finally {
      await new Promise((resolve) => elsewhere.close(resolve));
    }
  });

  describe('one deadline for the whole call (connect + headers + body timeouts)', () => {
    // 100 + 200 + 200 ms: a byte every 100 ms never trips the 200 ms idle timers.
    const short = ordersSettingsSchema.parse({
      connectTimeoutMs: 100,
      headersTimeoutMs: 200,
      bodyTimeoutMs: 200,
    });
    const deadlineMs = 500;
    let drips: NodeJS.Timeout[];
    beforeEach(async () => {
      drips = [];
      await checkout.close();
      // One connection: a second order waits in undici's queue.
      checkout = new ProviderApiClient(new Agent({ connections: 1 }), short);
      handler = (req, _body, res) => {
        res.writeHead(201, { 'content-type': 'application/json' });
        res.write('{"x":"');
        let left = 20; // 2 s of bytes, then the end: the old idle timers let it all through.
        const drip = setInterval(() => {
          if (--left > 0) res.write('y');
          else {
            clearInterval(drip);
            res.end('"}');
          }
        }, 100);
        drips.push(drip);
        req.socket.once('close', () => clearInterval(drip));
      };
    });
    afterEach(() => drips.forEach(clearInterval));

    it('ends an answer that drips a byte every 100 ms: timeout, maybe delivered', async () => {
      const started = performance.now();
      const outcome = await order();
      expect(performance.now() - started).toBeLessThan(deadlineMs + 400);
      expect(outcome).toMatchObject({
        kind: 'failed',
        delivered: 'maybe',
        error: { code: ProviderErrorCode.Timeout },
      });
    });

    it('ends an order still queued for a connection: never delivered, nothing sent', async () => {
      let received = 0;
      const drip = handler;
      handler = (req, body, res) => {
        received++;
        drip(req, body, res);
      };
      // The one connection is held by a call with a later deadline, so the queued order's own
      // deadline comes first however loaded the machine is (with equal deadlines, the holder's
      // abort could free the connection for it a moment before).
      const agent = new Agent({ connections: 1 });
      const holder = new ProviderApiClient(agent, { ...short, bodyTimeoutMs: 5000 });
      await checkout.close();
      checkout = new ProviderApiClient(agent, short);
      const held = order(baseUrl, undefined, holder);
      await waitFor(() => received === 1, { timeoutMs: 2000, what: 'the first order to arrive' });
      const started = performance.now();
      const queued = await order();
      expect(performance.now() - started).toBeLessThan(deadlineMs + 400);
      expect(queued).toMatchObject({
        kind: 'failed',
        delivered: 'no',
        error: { code: ProviderErrorCode.Timeout },
      });
      expect(received).toBe(1);
      for (const s of sockets) s.destroy();
      expect(await held).toMatchObject({ kind: 'failed', delivered: 'maybe' });
    });
  });

  it('reports a connection reset after sending as maybe delivered', async () => {
    handler = (req) => req.socket.destroy();
    const outcome = await order();
    expect(outcome).toMatchObject({
      kind: 'failed',
      delivered: 'maybe',
      error: { code: ProviderErrorCode.Unreachable },
    });
  });

  it('reports an answer cut off before its Content-Length as maybe delivered', async () => {
    handler = (_req, _body, res) => {
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"partial":');
      setTimeout(() => res.socket?.destroy(), 20);
    };
    const outcome = await order();
    expect(outcome).toMatchObject({ kind: 'failed', delivered: 'maybe' });
  });
});
