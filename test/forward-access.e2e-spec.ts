import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { type Stack, startStack } from './support/stack';

// In-process brokers and an emulator: more than Jest's 5 s on a shared machine.
jest.setTimeout(60_000);

/** The default allow-list. */
const SHOP = 'acme-prod';
/**
 * A client whose allow-list also lets payments be read, cancelled and refunded (below an orders
 * path the emulator answers 404 to anything: payments stand in for them here).
 */
const OPEN = 'acme-ops';
const OPEN_ALLOW = [
  { methods: ['POST'], path: '/api/checkout/v1/orders' },
  { methods: ['GET', 'DELETE', 'POST'], prefix: '/api/checkout/v1/payments/' },
  { prefix: '/api/marketing/v1/' },
];
const MARKETING_READS = [{ methods: ['GET'], prefix: '/api/marketing/v1/' }];

interface Problem {
  status: number;
  code: string;
  detail: string;
}

interface Answer {
  status: number;
  text: string;
  problem(): Problem;
}

/** One request through the broker's own routing (`inject`), as `caller`. */
async function send(
  app: NestFastifyApplication,
  key: string | undefined,
  method: string,
  url: string,
  init: { body?: string; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const res = await app.inject({
    method: method as 'GET',
    url,
    headers: { ...(key && { authorization: `Bearer ${key}` }), ...init.headers },
    ...(init.body !== undefined && { payload: init.body }),
  });
  return {
    status: res.statusCode,
    text: res.body,
    problem: () => {
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      return JSON.parse(res.body) as Problem;
    },
  };
}

const ORDER = JSON.stringify({ price: 1200, localization: { currency: 'USD' } });
const JSON_BODY = { 'content-type': 'application/json' };

describe('what a forward caller may forward: client allow-lists and grants (in-process)', () => {
  let stack: Stack;
  let app: NestFastifyApplication;
  let key: (caller: string) => string;

  beforeAll(async () => {
    stack = await startStack({
      name: 'forward-access',
      inProcess: true,
      clients: [SHOP, { id: OPEN, config: { forward: { allow: OPEN_ALLOW } } }],
      callerAuth: {
        mode: 'api-key',
        callers: {
          shop: { clients: [SHOP, OPEN], scopes: ['forward'] },
          reader: { clients: [SHOP, OPEN], scopes: ['forward'], forwardAllow: MARKETING_READS },
        },
      },
      env: { LOG_LEVEL: 'info', FORWARD_CLIENT_RATE_PER_SECOND: '0' },
    });
    app = stack.brokers[0].app!;
    key = (caller) => stack.keys[caller];
  });
  afterEach(() => stack.provider.reset());
  afterAll(async () => {
    await stack?.close();
  });

  it('opens by default only creating orders and reading the marketing API', async () => {
    const read = await send(app, key('shop'), 'GET', `/provider/${SHOP}/api/marketing/v1/offers`);
    expect(read.status).toBe(200);
    const head = await send(app, key('shop'), 'HEAD', `/provider/${SHOP}/api/marketing/v1/offers`);
    expect(head.status).toBe(200);
    const created = await send(
      app,
      key('shop'),
      'POST',
      `/provider/${SHOP}/api/checkout/v1/orders`,
      {
        body: ORDER,
        headers: JSON_BODY,
      },
    );
    expect(created.status).toBe(201);
    expect(stack.provider.stats.ordersCreated).toBe(1);
  });

  it.each([
    ['DELETE', '/api/checkout/v1/orders/o-1'],
    ['POST', '/api/checkout/v1/orders/o-1/refunds'],
    ['GET', '/api/checkout/v1/orders/o-1'],
    ['DELETE', '/api/checkout/v1/payments/p-1'],
    ['POST', '/api/checkout/v1/payments/p-1/refunds'],
    ['PUT', '/api/checkout/v1/orders'],
    ['POST', '/api/marketing/v1/applications'],
  ])(
    'refuses %s %s on the default allow-list: 403 naming the call and clients[].forward.allow, nothing sent',
    async (method, path) => {
      const answer = await send(app, key('shop'), method, `/provider/${SHOP}${path}`, {
        body: '{}',
        headers: JSON_BODY,
      });
      expect(answer.status).toBe(403);
      const problem = answer.problem();
      expect(problem.code).toBe('forward_not_allowed');
      expect(problem.detail).toContain(
        `${method} ${path} is outside the allow-list of client "${SHOP}"`,
      );
      expect(problem.detail).toContain(
        'POST on /api/checkout/v1/orders; GET, HEAD under /api/marketing/v1/',
      );
      expect(problem.detail).toContain('clients[].forward.allow');
      expect(stack.provider.stats.apiRequests + stack.provider.stats.orderRequests).toBe(0);
    },
  );

  it('lets a cancel or a refund through where the client allow-list has a rule for it', async () => {
    const cancelled = await send(
      app,
      key('shop'),
      'DELETE',
      `/provider/${OPEN}/api/checkout/v1/payments/p-1`,
    );
    expect(cancelled.status).toBe(200);
    const refunded = await send(
      app,
      key('shop'),
      'POST',
      `/provider/${OPEN}/api/checkout/v1/payments/p-1/refunds`,
      { body: '{"amount":5}', headers: JSON_BODY },
    );
    expect(refunded.status).toBe(201);
    expect(stack.provider.stats.calls.map((c) => `${c.method} ${c.path}`)).toEqual([
      'DELETE /api/checkout/v1/payments/p-1',
      'POST /api/checkout/v1/payments/p-1/refunds',
    ]);
  });

  it("narrows a caller to its grant's forwardAllow: 403 forbidden naming the setting, on the passthrough and POST /orders", async () => {
    const read = await send(app, key('reader'), 'GET', `/provider/${OPEN}/api/marketing/v1/offers`);
    expect(read.status).toBe(200);
    // The client's allow-list lets these through; the caller's own grant does not.
    for (const [method, url] of [
      ['DELETE', `/provider/${OPEN}/api/checkout/v1/payments/p-1`],
      ['POST', `/provider/${OPEN}/api/marketing/v1/applications`],
      ['POST', `/orders?client=${SHOP}`],
    ]) {
      const answer = await send(app, key('reader'), method, url, {
        body: ORDER,
        headers: JSON_BODY,
      });
      expect(answer.status).toBe(403);
      const problem = answer.problem();
      expect(problem.code).toBe('forbidden');
      expect(problem.detail).toContain('caller "reader" may not forward');
      expect(problem.detail).toContain('its grant allows only GET under /api/marketing/v1/');
      expect(problem.detail).toContain('forwardAllow');
    }
    const orders = await send(app, key('reader'), 'POST', `/orders?client=${SHOP}`, {
      body: ORDER,
      headers: JSON_BODY,
    });
    expect(orders.problem().detail).toContain(
      `POST /orders (POST /api/checkout/v1/orders for client "${SHOP}")`,
    );
    expect(stack.provider.stats.calls).toHaveLength(1);
    expect(stack.provider.stats.orderRequests).toBe(0);
    // The audit line says why; the caller was told the same.
    const refusals = stack.brokers[0]
      .logs()
      .map((line) => JSON.parse(line) as Record<string, unknown>)
      .filter((l) => l.caller === 'reader' && l.result === 'forbidden');
    expect(refusals.length).toBeGreaterThanOrEqual(3);
    for (const line of refusals) expect(line.reason).toBe('caller_forward_allow');
  });

  it("drops every header the caller's Connection names; orders still send their JSON headers", async () => {
    const hop = {
      connection: 'close, Accept, Content-Type, Accept-Language, X-Unknown',
      accept: 'application/xml',
      'content-type': 'application/json',
      'accept-language': 'fr',
    };
    const passed = await send(
      app,
      key('shop'),
      'DELETE',
      `/provider/${OPEN}/api/checkout/v1/payments/p-2`,
      {
        body: '{}',
        headers: hop,
      },
    );
    expect(passed.status).toBe(200);
    const received = stack.provider.stats.calls[0].headers;
    // The broker's own Accept, not the caller's.
    expect(received.accept).toBe('application/json');
    expect(received['content-type']).toBeUndefined();
    expect(received['accept-language']).toBeUndefined();
    expect(received['x-unknown']).toBeUndefined();

    // Without the nomination they travel on.
    stack.provider.reset();
    const plain: Record<string, string> = { ...hop };
    delete plain.connection;
    await send(app, key('shop'), 'DELETE', `/provider/${OPEN}/api/checkout/v1/payments/p-3`, {
      body: '{}',
      headers: plain,
    });
    expect(stack.provider.stats.calls[0].headers).toMatchObject({
      accept: 'application/xml',
      'content-type': 'application/json',
      'accept-language': 'fr',
    });

    const order = await send(app, key('shop'), 'POST', `/orders?client=${SHOP}`, {
      body: ORDER,
      headers: hop,
    });
    expect(order.status).toBe(201);
    expect(stack.provider.stats.orders[0].headers).toMatchObject({
      accept: 'application/json',
      'content-type': 'application/json',
    });
    expect(stack.provider.stats.orders[0].headers['accept-language']).toBeUndefined();
  });
});
