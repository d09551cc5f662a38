import { connect } from 'node:net';
import {
  DEFAULT_PROVIDER_KNOBS,
  PROVIDER_TOKEN_PATH,
  ProviderEmulator,
  type ProviderKnobs,
  type TokenFailure,
} from './provider-emulator';

const ID = 'merchant-1';
const SECRET = 'secret-1';
const CHECKOUT = '/api/checkout/v1/orders';
const FLEXPAY = '/api/flexpay/v1/orders';
type GarbageFailure = Omit<Extract<TokenFailure, { kind: 'garbage' }>, 'kind'>;
const GOOD_ORDER = {
  price: 1200,
  localization: { country: 'US', currency: 'USD', locale: 'en-US' },
};

function basic(id: string, secret: string): string {
  return `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`;
}

/** Polls `check` until it is true or the deadline passes. */
async function waitUntil(check: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

describe(ProviderEmulator.name, () => {
  let emu: ProviderEmulator;

  async function start(knobs?: Partial<ProviderKnobs>): Promise<ProviderEmulator> {
    emu = await ProviderEmulator.start({ credentials: { [ID]: SECRET }, knobs });
    return emu;
  }

  function requestToken(
    init: { authorization?: string | null; query?: string; body?: string; method?: string } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = {};
    const authorization = init.authorization === undefined ? basic(ID, SECRET) : init.authorization;
    if (authorization !== null) headers.authorization = authorization;
    if (init.body !== undefined) headers['content-type'] = 'application/x-www-form-urlencoded';
    return fetch(
      `${emu.url}${PROVIDER_TOKEN_PATH}${init.query ?? '?grant_type=client_credentials'}`,
      {
        method: init.method ?? 'POST',
        headers,
        body: init.body,
      },
    );
  }

  async function token(): Promise<string> {
    const res = await requestToken();
    expect(res.status).toBe(200);
    return ((await res.json()) as { access_token: string }).access_token;
  }

  function postOrder(
    accessToken: string | null,
    body: unknown = GOOD_ORDER,
    headers: Record<string, string> = {},
    path = CHECKOUT,
  ): Promise<Response> {
    return fetch(`${emu.url}${path}`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json',
        ...(accessToken !== null && { authorization: `Bearer ${accessToken}` }),
        ...headers,
      },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
  }

  afterEach(async () => {
    await emu?.close();
  });

  describe('token endpoint', () => {
    it('issues a unique Bearer token with the default 30-minute lifetime and records it', async () => {
      await start();
      expect(emu.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(emu.url).toBe(`http://127.0.0.1:${emu.port}`);
      const before = Date.now();
      const res = await requestToken();
      const after = Date.now();

      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(res.headers.get('cache-control')).toBe('no-store');
      const body = (await res.json()) as Record<string, unknown>;
      expect(body).toEqual({
        access_token: expect.any(String),
        token_type: 'Bearer',
        expires_in: 1800,
      });
      expect(body.access_token).toMatch(/^[A-Za-z0-9_-]{43}$/);

      const stats = emu.stats;
      expect(stats.tokenRequests).toBe(1);
      expect(stats.tokensIssued).toBe(1);
      expect(stats.tokenRequestTimes).toHaveLength(1);
      expect(stats.tokenRequestTimes[0]).toBeGreaterThanOrEqual(before);
      expect(stats.tokenRequestTimes[0]).toBeLessThanOrEqual(after);
      expect(stats.issued).toEqual([
        {
          token: body.access_token,
          clientId: ID,
          issuedAt: expect.any(Number),
          expiresAt: stats.issued[0].issuedAt + 1800_000,
        },
      ]);
      expect(emu.isValidToken(body.access_token as string)).toBe(true);
      expect(emu.isValidToken('never-issued')).toBe(false);

      const more = await Promise.all(Array.from({ length: 10 }, () => token()));
      expect(new Set([body.access_token, ...more]).size).toBe(11);
    });

    it('accepts form-urlencoded credentials (RFC 6749 §2.3.1) as well as raw ones', async () => {
      emu = await ProviderEmulator.start({ credentials: { 'id:x': 'p@ss w%rd' } });
      const encoded = basic(encodeURIComponent('id:x'), encodeURIComponent('p@ss w%rd'));
      expect((await requestToken({ authorization: encoded })).status).toBe(200);
      expect((await requestToken({ authorization: basic('id%3Ax', 'p%40ss+w%25rd') })).status).toBe(
        200,
      );
      await emu.close();
      emu = await ProviderEmulator.start({ credentials: { plain: 'p@ss w%rd' } });
      expect((await requestToken({ authorization: basic('plain', 'p@ss w%rd') })).status).toBe(200);
    });

    it.each([
      ['missing', null],
      ['not Basic', 'Bearer abc'],
      ['not base64', 'Basic !!!notbase64!!!'],
      ['without a colon', `Basic ${Buffer.from('no-colon').toString('base64')}`],
      ['with a wrong secret', basic(ID, 'wrong')],
      ['with an unknown client', basic('someone-else', SECRET)],
    ])('refuses credentials %s with 401 invalid_client', async (_what, authorization) => {
      await start();
      const res = await requestToken({ authorization });
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toBe('Basic');
      expect(await res.json()).toEqual({
        error: 'invalid_client',
        error_description: expect.any(String),
      });
      expect(emu.stats).toMatchObject({ tokenRequests: 1, tokensIssued: 0, rejectedTokenAuth: 1 });
    });

    it.each([
      ['no grant_type', '', undefined, 'invalid_request'],
      [
        'two grant_types',
        '?grant_type=client_credentials&grant_type=client_credentials',
        undefined,
        'invalid_request',
      ],
      ['another grant_type', '?grant_type=password', undefined, 'unsupported_grant_type'],
      [
        'grant_type in a form body (stock OAuth client)',
        '',
        'grant_type=client_credentials',
        'invalid_request',
      ],
      ['any body', '?grant_type=client_credentials', 'scope=x', 'invalid_request'],
    ])('answers %s with 400 %s', async (_what, query, body, error) => {
      await start();
      const res = await requestToken({ query, body });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: string }).error).toBe(error);
      expect(emu.stats.tokensIssued).toBe(0);
    });

    it('answers other methods with 405 and unknown paths with 404', async () => {
      await start();
      const get = await requestToken({ method: 'GET' });
      expect(get.status).toBe(405);
      expect(get.headers.get('allow')).toBe('POST');
      expect((await fetch(`${emu.url}/api/auth/v1/oauth/token/`, { method: 'POST' })).status).toBe(
        404,
      );
      expect((await fetch(`${emu.url}/`)).status).toBe(404);
    });

    it('accepts only the new credentials after setCredentials', async () => {
      await start();
      emu.setCredentials({ [ID]: 'rotated' });
      expect((await requestToken()).status).toBe(401);
      expect((await requestToken({ authorization: basic(ID, 'rotated') })).status).toBe(200);
      expect(emu.stats.rejectedTokenAuth).toBe(1);
    });
  });

  describe('token knobs', () => {
    it('reports and enforces tokenLifetimeSeconds', async () => {
      await start({ tokenLifetimeSeconds: 1 });
      const res = await requestToken();
      const body = (await res.json()) as { access_token: string; expires_in: number };
      expect(body.expires_in).toBe(1);
      const issued = emu.stats.issued[0];
      expect(issued.expiresAt - issued.issuedAt).toBe(1000);
      expect((await postOrder(body.access_token)).status).toBe(201);
      await waitUntil(() => Date.now() >= issued.expiresAt, 'the token to expire', 3000);
      expect(emu.isValidToken(body.access_token)).toBe(false);
      expect((await postOrder(body.access_token)).status).toBe(401);
    });

    it('issues already-expired tokens with a lifetime of 0', async () => {
      await start({ tokenLifetimeSeconds: 0 });
      const t = await token();
      expect(emu.isValidToken(t)).toBe(false);
      expect((await postOrder(t)).status).toBe(401);
    });

    it.each([
      [{ expiresIn: 'string' as const }, { token_type: 'Bearer', expires_in: '60' }],
      [{ expiresIn: 'omit' as const }, { token_type: 'Bearer' }],
      [{ tokenType: null }, { expires_in: 60 }],
      [{ tokenType: 'bearer' }, { token_type: 'bearer', expires_in: 60 }],
    ])('shapes the response with %j', async (knobs, expected) => {
      await start({ tokenLifetimeSeconds: 60 });
      emu.setKnobs(knobs);
      const body = (await (await requestToken()).json()) as Record<string, unknown>;
      expect(body).toEqual({ access_token: expect.any(String), ...expected });
    });

    it('delays the token answer by tokenLatencyMs', async () => {
      await start({ tokenLatencyMs: 150 });
      const t0 = Date.now();
      expect((await requestToken()).status).toBe(200);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(140);
    });

    it('fails every token request with a status tokenFailure until cleared', async () => {
      await start({ tokenFailure: { kind: 'status', status: 503, retryAfter: '7' } });
      for (let i = 0; i < 2; i++) {
        const res = await requestToken();
        expect(res.status).toBe(503);
        expect(res.headers.get('retry-after')).toBe('7');
        expect(await res.text()).toBe('');
      }
      emu.setKnobs({ tokenFailure: null });
      expect((await requestToken()).status).toBe(200);
      expect(emu.stats).toMatchObject({ tokenRequests: 3, tokensIssued: 1, rejectedTokenAuth: 0 });
    });

    it('answers 429 with Retry-After past tokenGrantsPerMinute, counting only grants', async () => {
      await start({ tokenGrantsPerMinute: 2 });
      await token();
      await token();
      const limited = await requestToken();
      expect(limited.status).toBe(429);
      expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(59);
      expect(emu.stats).toMatchObject({
        tokenRequests: 3,
        tokensIssued: 2,
        rateLimitedTokenRequests: 1,
      });
    });

    it('hands the same token out again until it expires with reissueTokens, even revoked', async () => {
      await start({ reissueTokens: true, tokenLifetimeSeconds: 600 });
      const first = await token();
      emu.revokeToken(first);
      expect(emu.isValidToken(first)).toBe(false);
      const res = await requestToken();
      const body = (await res.json()) as { access_token: string; expires_in: number };
      expect(body.access_token).toBe(first);
      expect(body.expires_in).toBeGreaterThan(590);
      expect(body.expires_in).toBeLessThanOrEqual(600);
      expect(emu.isValidToken(first)).toBe(true);
      expect(emu.stats).toMatchObject({ tokensIssued: 1, tokensReissued: 1 });
    });

    it('answers a 401 invalid_client tokenFailure with the given body and WWW-Authenticate', async () => {
      await start({
        tokenFailure: { kind: 'status', status: 401, body: '{"error":"invalid_client"}' },
      });
      const res = await requestToken();
      expect(res.status).toBe(401);
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(res.headers.get('www-authenticate')).toBe('Basic');
      expect(await res.json()).toEqual({ error: 'invalid_client' });
      expect(emu.stats.rejectedTokenAuth).toBe(0);
    });

    it.each([
      [
        'an HTML error page',
        { body: '<html><body>Bad gateway</body></html>', contentType: 'text/html', status: 502 },
      ],
      ['non-JSON', { body: 'not json', contentType: 'application/json' }],
      ['a negative expires_in', { body: '{"expires_in":-5}', contentType: 'application/json' }],
      ['a huge body', { body: 'x'.repeat(3 * 1024 * 1024), contentType: 'application/json' }],
    ])('answers a garbage tokenFailure with %s', async (_what, garbage: GarbageFailure) => {
      await start({ tokenFailure: { kind: 'garbage', ...garbage } });
      const res = await requestToken();
      expect(res.status).toBe(garbage.status ?? 200);
      expect(res.headers.get('content-type')).toBe(garbage.contentType);
      expect(await res.text()).toBe(garbage.body);
      expect(emu.stats.tokensIssued).toBe(0);
    });

    it('never answers with a timeout tokenFailure, and close() ends the hung request', async () => {
      await start({ tokenFailure: { kind: 'timeout' } });
      await expect(
        fetch(`${emu.url}${PROVIDER_TOKEN_PATH}?grant_type=client_credentials`, {
          method: 'POST',
          headers: { authorization: basic(ID, SECRET) },
          signal: AbortSignal.timeout(200),
        }),
      ).rejects.toMatchObject({ name: 'TimeoutError' });

      const hung = requestToken();
      await waitUntil(() => emu.stats.tokenRequests === 2, 'the second request to arrive');
      await emu.close();
      await expect(hung).rejects.toThrow();
    });

    it('resets the connection with a reset tokenFailure', async () => {
      await start({ tokenFailure: { kind: 'reset' } });
      await expect(requestToken()).rejects.toThrow('fetch failed');
      expect(emu.stats).toMatchObject({ tokenRequests: 1, tokensIssued: 0 });
    });

    it('consumes failNextTokenRequests before tokenFailure, then recovers', async () => {
      await start();
      emu.failNextTokenRequests(2, { kind: 'status', status: 500 });
      expect((await requestToken()).status).toBe(500);
      emu.setKnobs({ tokenFailure: { kind: 'status', status: 429, retryAfter: '1' } });
      expect((await requestToken()).status).toBe(500);
      expect((await requestToken()).status).toBe(429);
      emu.setKnobs({ tokenFailure: null });
      expect((await requestToken()).status).toBe(200);
      expect(emu.stats).toMatchObject({ tokenRequests: 4, tokensIssued: 1 });
    });
  });

  describe('orders endpoint', () => {
    it.each([CHECKOUT, FLEXPAY])(
      'creates an order at %s and records body and headers',
      async (path) => {
        await start();
        const t = await token();
        const res = await postOrder(
          t,
          GOOD_ORDER,
          { 'Idempotency-Key': 'key-1', 'X-Trace': 'abc' },
          path,
        );
        expect(res.status).toBe(201);
        const body = (await res.json()) as { orderId: string; redirectUrl: string; status: string };
        expect(body.orderId).toMatch(/^ord_[0-9a-f]+$/);
        expect(body).toEqual({
          orderId: body.orderId,
          redirectUrl: `https://checkout.example.test/r/${body.orderId}`,
          status: 'CREATED',
        });
        const { orders, orderRequests, ordersCreated } = emu.stats;
        expect({ orderRequests, ordersCreated }).toEqual({ orderRequests: 1, ordersCreated: 1 });
        expect(orders).toEqual([
          {
            id: body.orderId,
            path,
            body: GOOD_ORDER,
            headers: expect.objectContaining({
              authorization: `Bearer ${t}`,
              'idempotency-key': 'key-1',
              'x-trace': 'abc',
              'content-type': 'application/json',
            }),
            idempotencyKey: 'key-1',
            createdAt: expect.any(Number),
          },
        ]);
      },
    );

    it('creates a new order for every request, even with the same Idempotency-Key', async () => {
      await start();
      const t = await token();
      const a = await postOrder(t, GOOD_ORDER, { 'idempotency-key': 'same' });
      const b = await postOrder(t, GOOD_ORDER, { 'idempotency-key': 'same' });
      const [ja, jb] = (await Promise.all([a.json(), b.json()])) as Array<{ orderId: string }>;
      expect(ja.orderId).not.toBe(jb.orderId);
      expect(emu.stats.ordersCreated).toBe(2);
      expect(emu.stats.orders.map((o) => o.idempotencyKey)).toEqual(['same', 'same']);
    });

    it('leaves idempotencyKey out when the header is absent', async () => {
      await start();
      await postOrder(await token());
      expect(emu.stats.orders[0]).not.toHaveProperty('idempotencyKey');
    });

    it.each([
      ['no Authorization', {}],
      ['a Basic Authorization', { authorization: basic(ID, SECRET) }],
      ['an unknown token', { authorization: 'Bearer not-a-token' }],
      ['an empty Bearer', { authorization: 'Bearer ' }],
    ])('refuses %s with 401 invalid_token', async (_what, headers) => {
      await start();
      const res = await postOrder(null, GOOD_ORDER, headers);
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toBe('Bearer error="invalid_token"');
      expect(await res.json()).toEqual({ error: 'invalid_token' });
      expect(emu.stats).toMatchObject({ orderRequests: 1, ordersCreated: 0 });
    });

    it('refuses revoked tokens (revokeToken, revokeAll) but accepts later ones', async () => {
      await start();
      const [a, b] = [await token(), await token()];
      emu.revokeToken(a);
      expect(emu.isValidToken(a)).toBe(false);
      expect((await postOrder(a)).status).toBe(401);
      expect((await postOrder(b)).status).toBe(201);
      emu.revokeAll();
      expect((await postOrder(b)).status).toBe(401);
      const c = await token();
      expect((await postOrder(c)).status).toBe(201);
    });

    it('requires application/json (parameters allowed) and a JSON object body', async () => {
      await start();
      const t = await token();
      const plain = await postOrder(t, GOOD_ORDER, { 'content-type': 'text/plain' });
      expect(plain.status).toBe(415);
      const charset = await postOrder(t, GOOD_ORDER, {
        'content-type': 'Application/JSON; charset=utf-8',
      });
      expect(charset.status).toBe(201);
      for (const bad of ['{"price":', '', '[1,2]', 'null']) {
        const res = await postOrder(t, bad);
        expect(res.status).toBe(400);
        expect(await res.json()).toEqual({ errorCodes: ['INVALID_REQUEST'] });
      }
      expect(emu.stats.ordersCreated).toBe(1);
    });

    it.each([
      ['a price under 100', { price: 99 }, 'MIN_PRICE'],
      [
        'a currency other than USD',
        { price: 1200, localization: { currency: 'EUR' } },
        'INVALID_CURRENCY',
      ],
    ])('answers %s with 422 and errorCodes', async (_what, order, code) => {
      await start();
      const res = await postOrder(await token(), order);
      expect(res.status).toBe(422);
      expect(await res.json()).toEqual({ errorCodes: [code] });
      expect(emu.stats.ordersCreated).toBe(0);
    });

    it('answers other methods with 405 and sub-paths with 404', async () => {
      await start();
      expect((await fetch(`${emu.url}${CHECKOUT}`)).status).toBe(405);
      expect((await fetch(`${emu.url}${CHECKOUT}/ord_1`, { method: 'POST' })).status).toBe(404);
    });

    it('refuses bodies over 2 MiB with 413', async () => {
      await start();
      const res = await postOrder(await token(), { price: 1200, pad: 'x'.repeat(3 * 1024 * 1024) });
      expect(res.status).toBe(413);
      expect(emu.stats.ordersCreated).toBe(0);
    });

    it('rejects the next n orders with 401 even with a valid token, creating nothing', async () => {
      await start();
      const t = await token();
      emu.rejectNextOrders(2);
      for (let i = 0; i < 2; i++) {
        const res = await postOrder(t);
        expect(res.status).toBe(401);
        expect(res.headers.get('www-authenticate')).toBe('Bearer error="invalid_token"');
      }
      expect(emu.isValidToken(t)).toBe(true);
      expect((await postOrder(t)).status).toBe(201);
      expect(emu.stats).toMatchObject({ orderRequests: 3, ordersCreated: 1 });
    });

    it('delays orders by ordersLatencyMs', async () => {
      await start({ ordersLatencyMs: 150 });
      const t = await token();
      const t0 = Date.now();
      expect((await postOrder(t)).status).toBe(201);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(140);
    });

    it('fails orders with a status ordersFailure, creating nothing', async () => {
      await start({
        ordersFailure: { kind: 'status', status: 500, body: '{"errorCodes":["UNKNOWN"]}' },
      });
      const res = await postOrder(await token());
      expect(res.status).toBe(500);
      expect(await res.json()).toEqual({ errorCodes: ['UNKNOWN'] });
      expect(emu.stats.ordersCreated).toBe(0);
    });

    it('creates the order and never answers with timeout-after-create', async () => {
      await start({ ordersFailure: { kind: 'timeout-after-create' } });
      const t = await token();
      const pending = postOrder(t, GOOD_ORDER, { 'idempotency-key': 'unknown-outcome' });
      await waitUntil(() => emu.stats.ordersCreated === 1, 'the order to be created');
      expect(emu.stats.orders[0].idempotencyKey).toBe('unknown-outcome');
      await emu.close();
      await expect(pending).rejects.toThrow();
    });

    it('still validates before timeout-after-create', async () => {
      await start({ ordersFailure: { kind: 'timeout-after-create' } });
      expect((await postOrder(await token(), { price: 5 })).status).toBe(422);
      expect((await postOrder('bad')).status).toBe(401);
    });

    it('never answers and creates nothing with a timeout ordersFailure', async () => {
      await start({ ordersFailure: { kind: 'timeout' } });
      const t = await token();
      const pending = postOrder(t);
      await waitUntil(() => emu.stats.orderRequests === 1, 'the order request to arrive');
      await emu.close();
      await expect(pending).rejects.toThrow();
      expect(emu.stats.ordersCreated).toBe(0);
    });

    it('resets the connection with a reset ordersFailure, creating nothing', async () => {
      await start({ ordersFailure: { kind: 'reset' } });
      await expect(postOrder(await token())).rejects.toThrow('fetch failed');
      expect(emu.stats).toMatchObject({ orderRequests: 1, ordersCreated: 0 });
    });
  });

  describe('housekeeping', () => {
    it('reset() clears stats, faults and knobs but keeps credentials and issued tokens', async () => {
      await start({ tokenLifetimeSeconds: 60, expiresIn: 'omit' });
      const t = await token();
      emu.failNextTokenRequests(1, { kind: 'status', status: 500 });
      emu.rejectNextOrders(1);
      emu.setKnobs({ ordersFailure: { kind: 'reset' } });

      emu.reset();
      expect(emu.stats).toEqual({
        tokenRequests: 0,
        tokensIssued: 0,
        tokenRequestTimes: [],
        issued: [],
        orderRequests: 0,
        ordersCreated: 0,
        orders: [],
        rejectedTokenAuth: 0,
        rateLimitedTokenRequests: 0,
        tokensReissued: 0,
        apiRequests: 0,
        calls: [],
      });
      const body = (await (await requestToken()).json()) as { expires_in: number };
      expect(body.expires_in).toBe(DEFAULT_PROVIDER_KNOBS.tokenLifetimeSeconds);
      expect((await postOrder(t)).status).toBe(201);
    });

    it('returns stats snapshots that later requests and callers cannot change', async () => {
      await start();
      const t = await token();
      await postOrder(t);
      const snapshot = emu.stats;
      snapshot.issued.length = 0;
      (snapshot.orders[0].body as { price: number }).price = 1;
      await token();
      expect(snapshot.tokensIssued).toBe(1);
      expect(emu.stats.issued).toHaveLength(2);
      expect(emu.stats.orders[0].body).toEqual(GOOD_ORDER);
    });

    it('survives malformed HTTP and keeps serving', async () => {
      await start();
      await new Promise<void>((resolve, reject) => {
        const socket = connect(emu.port, '127.0.0.1', () => {
          socket.write('THIS IS NOT HTTP\r\n\r\n');
        });
        socket.on('error', reject);
        socket.on('close', () => resolve());
        socket.resume();
      });
      expect((await requestToken()).status).toBe(200);
    });

    it('close() is idempotent', async () => {
      await start();
      await Promise.all([emu.close(), emu.close()]);
      await emu.close();
    });
  });
});
