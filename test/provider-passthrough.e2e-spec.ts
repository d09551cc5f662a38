import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { Redis } from 'ioredis';
import { FLEET_CLIENT } from './support/fleet';
import { type Stack, startStack } from './support/stack';
import { metricValue } from './support/token-watch';

// A Redis and three brokers on a shared machine take more than Jest's 5 s to start.
jest.setTimeout(120_000);

const WIDE_ALLOW_LIST = [{ prefix: '/api/checkout/v1/' }, { prefix: '/api/marketing/v1/' }];

/**
 * Three replicas inside the Jest process on one Redis and one provider emulator: what is
 * shared between them goes through Redis, as between processes.
 */
function startReplicas(env: Record<string, string>): Promise<Stack> {
  return startStack({
    name: 'passthrough',
    inProcess: true,
    // Every method under both APIs: the suite exercises the passthrough, not the default list.
    clients: [{ id: FLEET_CLIENT, config: { forward: { allow: WIDE_ALLOW_LIST } } }],
    redis: 'standalone',
    replicas: 3,
    env: { LOG_LEVEL: 'warn', ...env },
  });
}

const MARKETING = `/provider/${FLEET_CLIENT}/api/marketing/v1`;
const CHECKOUT = `/provider/${FLEET_CLIENT}/api/checkout/v1`;

interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

async function call(
  base: string,
  path: string,
  init: { method?: string; body?: string | Uint8Array; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const res = await fetch(`${base}${path}`, {
    method: init.method ?? 'GET',
    body: init.body,
    headers: init.headers,
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** Sends `target` verbatim over a raw socket (no client-side normalisation); the status code. */
function rawStatus(url: string, method: string, target: string): Promise<number> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () =>
      socket.write(
        `${method} ${target} HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`,
      ),
    );
    let data = '';
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => (data += chunk));
    socket.once('error', reject);
    socket.once('close', () => {
      const match = /^HTTP\/1\.1 (\d{3})/.exec(data);
      if (match) resolve(Number(match[1]));
      else reject(new Error(`no HTTP answer to ${target}: ${JSON.stringify(data.slice(0, 80))}`));
    });
  });
}

describe('provider passthrough /provider/<client>/... (3 brokers, real Redis, emulator)', () => {
  let fleet: Stack;
  let broker: string;

  beforeAll(async () => {
    fleet = await startReplicas({
      FORWARD_CLIENT_RATE_PER_SECOND: '0',
      FORWARD_CALLER_RATE_PER_SECOND: '0',
      FORWARD_MAX_RESPONSE_BYTES: String(8 * 1024 * 1024),
      FORWARD_BODY_LIMIT_BYTES: String(64 * 1024),
    });
    broker = fleet.brokers[0].url;
  });
  afterEach(() => fleet.provider.reset());
  afterAll(async () => {
    await fleet?.close();
  });

  it('forwards a GET with its query and the bearer token, never the caller credential or cookies, and returns only safe headers', async () => {
    const answer = await call(broker, `${MARKETING}/offers?amount=500&currency=USD`, {
      headers: { authorization: 'Bearer caller-credential', cookie: 'session=caller' },
    });
    expect(answer.status).toBe(200);
    const echoed = JSON.parse(answer.text) as {
      method: string;
      path: string;
      query: string;
      headers: Record<string, string>;
    };
    expect(echoed).toMatchObject({
      method: 'GET',
      path: '/api/marketing/v1/offers',
      query: 'amount=500&currency=USD',
    });
    // What the provider received; its echo redacts the token (see the next test for why).
    const received = fleet.provider.stats.calls[0].headers.authorization;
    const bearer = /^Bearer (.+)$/.exec(received ?? '')?.[1];
    expect(bearer).toBeDefined();
    expect(fleet.provider.isValidToken(bearer!)).toBe(true);
    expect(echoed.headers.authorization).toBe('Bearer [redacted]');
    expect(echoed.headers.cookie).toBeUndefined();
    expect(echoed.headers['x-request-id']).toBe(answer.headers.get('x-request-id'));
    expect(answer.headers.get('cache-control')).toBe('private, max-age=5');
    expect(answer.headers.get('x-provider-request-id')).toMatch(/^prov-/);
    expect(answer.headers.get('set-cookie')).toBeNull();
    expect(answer.headers.get('x-internal-host')).toBeNull();
  });

  it.each(['verbatim', 'split'] as const)(
    'never relays an answer that echoes the token (%s): 502 forward_upstream_echoed_token, logged and counted',
    async (echo) => {
      fleet.provider.setKnobs({ echoAuthorization: echo });
      const before = await metricValue(broker, 'token_broker_upstream_token_echoes_total', {
        client: FLEET_CLIENT,
        call: 'forward',
      });
      const answer = await call(broker, `${MARKETING}/debug?echo=1`);
      expect(answer.status).toBe(502);
      expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect((JSON.parse(answer.text) as { code: string }).code).toBe(
        'forward_upstream_echoed_token',
      );
      const sent = /^Bearer (.+)$/.exec(fleet.provider.stats.calls[0].headers.authorization)?.[1];
      expect(sent).toBeDefined();
      expect(answer.text).not.toContain(sent!);
      expect(
        await metricValue(broker, 'token_broker_upstream_token_echoes_total', {
          client: FLEET_CLIENT,
          call: 'forward',
        }),
      ).toBe(before + 1);
      // A keyed request: answered the same, and its repeat never replays the echo.
      const init = {
        method: 'POST',
        body: '{}',
        headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID() },
      };
      const keyed = await call(broker, `${CHECKOUT}/debug`, init);
      expect(keyed.status).toBe(502);
      const repeat = await call(fleet.brokers[1].url, `${CHECKOUT}/debug`, init);
      expect(repeat.status).toBe(409);
      expect(repeat.text).not.toContain('Bearer');
    },
  );

  it('forwards POST, PUT, PATCH and DELETE with their bodies and content types, and HEAD', async () => {
    for (const method of ['POST', 'PUT', 'PATCH', 'DELETE']) {
      const body = JSON.stringify({ method, n: 1 });
      const answer = await call(broker, `${CHECKOUT}/payments/p-1/notes`, {
        method,
        body,
        headers: { 'content-type': 'application/json' },
      });
      expect(answer.status).toBe(method === 'POST' ? 201 : 200);
      const echoed = JSON.parse(answer.text) as {
        method: string;
        body: string;
        headers: Record<string, string>;
      };
      expect(echoed.method).toBe(method);
      expect(echoed.body).toBe(body);
      expect(echoed.headers['content-type']).toBe('application/json');
    }
    const text = await call(broker, `${MARKETING}/notes`, {
      method: 'PUT',
      body: 'plain words',
      headers: { 'content-type': 'text/plain' },
    });
    expect((JSON.parse(text.text) as { body: string }).body).toBe('plain words');
    const head = await call(broker, `${MARKETING}/offers`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.text).toBe('');
    expect(fleet.provider.stats.calls.map((c) => c.method)).toEqual([
      'POST',
      'PUT',
      'PATCH',
      'DELETE',
      'PUT',
      'HEAD',
    ]);
  });

  it('streams a large answer through, and cuts one over FORWARD_MAX_RESPONSE_BYTES', async () => {
    const size = 6 * 1024 * 1024 + 123;
    const res = await fetch(`${broker}${MARKETING}/large?bytes=${size}`);
    expect(res.status).toBe(200);
    let received = 0;
    for await (const chunk of res.body!) received += (chunk as Uint8Array).length;
    expect(received).toBe(size);

    const over = await fetch(`${broker}${MARKETING}/large?bytes=${12 * 1024 * 1024}`);
    expect(over.status).toBe(200);
    let cut = 0;
    await expect(
      (async () => {
        for await (const chunk of over.body!) cut += (chunk as Uint8Array).length;
      })(),
    ).rejects.toThrow();
    expect(cut).toBeLessThanOrEqual(8 * 1024 * 1024);
  });

  it('refuses a body over FORWARD_BODY_LIMIT_BYTES with 413 and sends nothing; takes one without a media type', async () => {
    const big = await call(broker, `${MARKETING}/uploads`, {
      method: 'POST',
      body: 'x'.repeat(100 * 1024),
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(big.status).toBe(413);
    expect((JSON.parse(big.text) as { code: string }).code).toBe('forward_body_too_large');
    expect(fleet.provider.stats.apiRequests).toBe(0);
    const bare = await call(broker, `${MARKETING}/uploads`, {
      method: 'PUT',
      body: new Uint8Array([1, 2, 3]),
    });
    expect(bare.status).toBe(200);
  });

  it('refuses what the allow-list does not cover with 403 forward_not_allowed naming the rules', async () => {
    for (const path of [
      `/provider/${FLEET_CLIENT}/api/auth/v1/oauth/token?grant_type=client_credentials`,
      `/provider/${FLEET_CLIENT}/api/marketing/v1-admin/users`,
      `/provider/${FLEET_CLIENT}/api/marketing/v2/offers`,
      `/provider/${FLEET_CLIENT}/api/marketing/v1`,
    ]) {
      const answer = await call(broker, path, { method: 'POST', body: '{}' });
      expect(answer.status).toBe(403);
      const problem = JSON.parse(answer.text) as { code: string; detail: string };
      expect(problem.code).toBe('forward_not_allowed');
      expect(problem.detail).toContain('under /api/marketing/v1/');
    }
    expect(fleet.provider.stats.apiRequests + fleet.provider.stats.tokenRequests).toBe(0);
  });

  it.each([
    ['dot-dot', `${MARKETING}/../../auth/v1/oauth/token`],
    ['encoded dot-dot', `${MARKETING}/%2e%2e/%2E%2e/auth/v1/oauth/token`],
    ['dot segment', `/provider/${FLEET_CLIENT}/./api/marketing/v1/offers`],
    ['dot-dot with ;', `${MARKETING}/..;/..;/auth/v1/oauth/token`],
    ['dot-dot with ;x', `${MARKETING}/..;x/..;x/auth/v1/oauth/token`],
    ['encoded dot-dot with %3b', `${MARKETING}/%2e%2E%3b/.%2e%3B/auth/v1/oauth/token`],
    ['path parameter', `${MARKETING}/offers;jsessionid=1`],
    ['encoded slash', `${MARKETING}/..%2f..%2fauth/v1/oauth/token`],
    ['encoded backslash', `${MARKETING}/..%5c..%5cauth`],
    ['backslash', `${MARKETING}/..\\..\\auth`],
    ['double slash', `${MARKETING}//offers`],
    ['double encoding', `${MARKETING}/%252e%252e/%252e%252e/auth`],
    ['encoded NUL', `${MARKETING}/offers%00.json`],
    ['malformed escape', `${MARKETING}/offers%zz`],
    ['absolute form', `http://evil.example${MARKETING}/offers`],
    ['no provider path', `/provider/${FLEET_CLIENT}`],
  ])('refuses a path trick (%s) with 400 or 404 and sends nothing', async (_name, target) => {
    const status = await rawStatus(broker, 'GET', target);
    expect([400, 404]).toContain(status);
    expect(fleet.provider.stats.apiRequests).toBe(0);
  });

  it('replays a POST with the same Idempotency-Key and body, 422 for another body, keys scoped by path', async () => {
    const key = randomUUID();
    const body = JSON.stringify({ amount: 500 });
    const headers = { 'content-type': 'application/json', 'idempotency-key': key };
    const first = await call(broker, `${MARKETING}/applications`, {
      method: 'POST',
      body,
      headers,
    });
    expect(first.status).toBe(201);
    // Another broker of the fleet: the record is in Redis.
    const again = await call(fleet.brokers[1].url, `${MARKETING}/applications`, {
      method: 'POST',
      body,
      headers,
    });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.text).toBe(first.text);
    const other = await call(broker, `${MARKETING}/applications`, {
      method: 'POST',
      body: JSON.stringify({ amount: 501 }),
      headers,
    });
    expect(other.status).toBe(422);
    expect((JSON.parse(other.text) as { code: string }).code).toBe('idempotency_key_reused');
    const elsewhere = await call(broker, `${CHECKOUT}/applications`, {
      method: 'POST',
      body,
      headers,
    });
    expect(elsewhere.status).toBe(201);
    expect(elsewhere.headers.get('idempotent-replayed')).toBeNull();
    expect(fleet.provider.stats.calls).toHaveLength(2);
  });

  it('keeps a keyed passthrough record for FORWARD_IDEMPOTENCY_TTL_SECONDS (1 h), counted for its caller', async () => {
    const answer = await call(broker, `${MARKETING}/applications`, {
      method: 'POST',
      body: '{"ttl":1}',
      headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID() },
    });
    expect(answer.status).toBe(201);
    const raw = new Redis(fleet.redis!.url!, { maxRetriesPerRequest: 1 });
    try {
      const records = await raw.keys(`tb:{${FLEET_CLIENT}}:idem:*`);
      expect(records.length).toBeGreaterThan(0);
      for (const key of records) {
        const ttl = await raw.pttl(key);
        expect(ttl).toBeGreaterThan(3_500_000);
        expect(ttl).toBeLessThanOrEqual(3_600_000);
      }
      const held = await raw.keys(`tb:{${FLEET_CLIENT}}:idemq:*`);
      expect(held).toHaveLength(1);
      expect(await raw.zcard(held[0])).toBe(records.length);
    } finally {
      raw.disconnect();
    }
  });

  it('passes a provider 429 back with its Retry-After and never retries it', async () => {
    fleet.provider.setKnobs({
      apiFailure: {
        kind: 'status',
        status: 429,
        body: '{"errorCodes":["TOO_MANY"]}',
        headers: { 'retry-after': '7' },
      },
    });
    const answer = await call(broker, `${MARKETING}/offers`, {
      method: 'POST',
      body: '{}',
      headers: { 'content-type': 'application/json' },
    });
    expect(answer.status).toBe(429);
    expect(answer.headers.get('retry-after')).toBe('7');
    expect(answer.text).toContain('TOO_MANY');
    expect(fleet.provider.stats.apiRequests).toBe(1);
  });

  it('401 storm on a non-order POST across 3 brokers: one token request, each call processed once', async () => {
    // Warm every broker's token, then have the provider stop honouring it.
    await Promise.all(fleet.brokers.map((b) => call(b.url, `${MARKETING}/offers`)));
    fleet.provider.reset();
    fleet.provider.revokeAll();
    const perBroker = 10;
    const answers = await Promise.all(
      fleet.brokers.flatMap((b, i) =>
        Array.from({ length: perBroker }, (_, j) =>
          call(b.url, `${MARKETING}/applications`, {
            method: 'POST',
            body: JSON.stringify({ broker: i, n: j }),
            headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID() },
          }),
        ),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 201));
    const stats = fleet.provider.stats;
    expect(stats.tokensIssued).toBe(1);
    const bodies = stats.calls.map((c) => c.body);
    expect(bodies).toHaveLength(3 * perBroker);
    expect(new Set(bodies).size).toBe(3 * perBroker);
    console.log(
      `401 storm: ${3 * perBroker} POSTs on 3 brokers, ${stats.tokenRequests} token request(s), ${stats.apiRequests} provider calls (${stats.calls.length} processed)`,
    );
  });
});

describe('passthrough rate limit across 3 brokers (shared through Redis)', () => {
  const LIMIT = 20;
  let fleet: Stack;

  beforeAll(async () => {
    fleet = await startReplicas({
      FORWARD_CLIENT_RATE_PER_SECOND: String(LIMIT),
      FORWARD_CLIENT_RATE_BURST: '0',
      FORWARD_CALLER_RATE_PER_SECOND: '0',
    });
  });
  afterAll(async () => {
    await fleet?.close();
  });

  it('lets through the client limit fleet-wide (within 10 %), answering 429 with Retry-After beyond it', async () => {
    const RUN_MS = 5000;
    const started = Date.now();
    let ok = 0;
    let limited = 0;
    let retryAfter: string | null = null;
    // 3 callers' loops per broker, a bounded run: far more demand than the limit. Requests stop
    // 100 ms before the end, so none opens a sixth 1-second window of the limiter (its windows
    // start with the first request) and the run covers exactly RUN_MS / 1000 windows.
    await Promise.all(
      fleet.brokers.flatMap((b) =>
        Array.from({ length: 3 }, async () => {
          while (Date.now() - started < RUN_MS - 100) {
            const answer = await call(b.url, `${MARKETING}/offers`);
            if (answer.status === 200) ok++;
            else if (answer.status === 429) {
              limited++;
              retryAfter = answer.headers.get('retry-after');
              expect((JSON.parse(answer.text) as { code: string }).code).toBe(
                'forward_rate_limited',
              );
            } else throw new Error(`unexpected ${answer.status}: ${answer.text}`);
          }
        }),
      ),
    );
    const seconds = RUN_MS / 1000;
    const rate = ok / seconds;
    console.log(
      `fleet rate limit ${LIMIT}/s on 3 brokers: ${ok} forwarded, ${limited} refused in ${seconds} s of limiter windows = ${rate.toFixed(1)}/s (shared machine)`,
    );
    expect(limited).toBeGreaterThan(0);
    expect(retryAfter).toMatch(/^\d+$/);
    expect(fleet.provider.stats.calls).toHaveLength(ok);
    expect(Math.abs(rate - LIMIT) / LIMIT).toBeLessThanOrEqual(0.1);
    // Counted per client, caller and outcome, on every replica.
    const counted = async (outcome: string) =>
      (
        await Promise.all(
          fleet.brokers.map((b) =>
            metricValue(b.url, 'token_broker_forward_requests_total', {
              client: FLEET_CLIENT,
              outcome,
            }),
          ),
        )
      ).reduce((a, b) => a + b, 0);
    expect(await counted('forwarded')).toBe(ok);
    expect(await counted('forward_rate_limited')).toBe(limited);
  });
});
