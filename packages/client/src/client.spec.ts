import { mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBrokerClient } from './client';
import {
  BrokerAuthError,
  BrokerError,
  BrokerRequestError,
  BrokerUnavailableError,
  OrderOutcomeUnknownError,
} from './errors';

interface Seen {
  method: string;
  url: string;
  authorization?: string;
  idempotencyKey?: string;
  body: string;
  at: number;
}

type Answer = {
  status: number;
  headers?: Record<string, string>;
  body?: unknown;
  delayMs?: number;
};

/**
 * A stand-in broker on a real socket: each request is answered by the next scripted answer
 * (the last one repeats), so the client's real HTTP, timing and parsing are what is tested.
 */
class StandIn {
  readonly seen: Seen[] = [];
  private answers: Answer[] = [];
  private constructor(
    private readonly server: Server,
    readonly url: string,
  ) {}

  static async start(): Promise<StandIn> {
    const ref: { self?: StandIn } = {};
    const server = createServer((req, res) => void ref.self!.handle(req, res));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    ref.self = new StandIn(server, `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    return ref.self;
  }

  script(...answers: Answer[]): void {
    this.answers = answers;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body = '';
    for await (const chunk of req) body += String(chunk);
    this.seen.push({
      method: req.method ?? '',
      url: req.url ?? '',
      authorization: req.headers.authorization,
      idempotencyKey: req.headers['idempotency-key'] as string | undefined,
      body,
      at: Date.now(),
    });
    const answer = this.answers.length > 1 ? this.answers.shift()! : this.answers[0];
    if (answer.delayMs) await sleep(answer.delayMs);
    if (res.destroyed) return;
    const isProblem = typeof (answer.body as { code?: unknown } | undefined)?.code === 'string';
    res.writeHead(answer.status, {
      'content-type': isProblem ? 'application/problem+json' : 'application/json',
      'x-request-id': `req-${this.seen.length}`,
      ...answer.headers,
    });
    res.end(answer.body === undefined ? '' : JSON.stringify(answer.body));
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((r) => this.server.close(r));
  }
}

const token = (access_token: string, expires_in: number): Answer => ({
  status: 200,
  body: { access_token, token_type: 'Bearer', expires_in },
});
const problem = (status: number, code: string, headers?: Record<string, string>): Answer => ({
  status,
  headers,
  body: { type: `urn:token-broker:problem:${code}`, status, code, detail: `it is ${code}` },
});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('createBrokerClient', () => {
  let broker: StandIn;
  beforeEach(async () => {
    broker = await StandIn.start();
  });
  afterEach(async () => {
    await broker.close();
  });
  const client = (extra: Record<string, unknown> = {}) =>
    createBrokerClient({ baseUrl: broker.url, apiKey: 'k-123', retryBaseMs: 10, ...extra });

  describe('getToken', () => {
    it('asks once, sends the API key as Bearer, serves from cache after', async () => {
      broker.script(token('tok-1', 1800));
      const c = client();
      const first = await c.getToken({ client: 'acme-prod' });
      const again = await c.getToken({ client: 'acme-prod' });
      expect(first.accessToken).toBe('tok-1');
      expect(again).toBe(first);
      expect(first.expiresAt.getTime()).toBeGreaterThan(Date.now() + 1790_000);
      expect(broker.seen).toHaveLength(1);
      expect(broker.seen[0]).toMatchObject({
        method: 'GET',
        url: '/token?client=acme-prod',
        authorization: 'Bearer k-123',
      });
    });

    it('single flight: concurrent callers share one request', async () => {
      broker.script(token('tok-1', 1800));
      const c = client();
      const all = await Promise.all(
        Array.from({ length: 20 }, () => c.getToken({ client: 'acme-prod' })),
      );
      expect(new Set(all.map((t) => t.accessToken))).toEqual(new Set(['tok-1']));
      expect(broker.seen).toHaveLength(1);
    });

    it('keeps a cache per client and passes min_ttl on', async () => {
      broker.script(token('tok-a', 1800), token('tok-b', 1800));
      const c = client();
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-a');
      expect((await c.getToken({ client: 'globex-prod', minTtl: 90.5 })).accessToken).toBe('tok-b');
      expect(broker.seen.map((s) => s.url)).toEqual([
        '/token?client=acme-prod',
        '/token?client=globex-prod&min_ttl=91',
      ]);
    });

    it('refreshes ahead in the background: the caller gets the cached token at once', async () => {
      // 4 s tokens: margin min(5 s, 1 s) = 1 s, lead 2 s, so the first is refreshed ahead from
      // 3 s before its expiry, i.e. at once with refreshAheadMs 3500.
      broker.script(token('tok-1', 4), token('tok-2', 4));
      const c = client({ refreshAheadMs: 3500 });
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-1');
      const started = Date.now();
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-1');
      expect(Date.now() - started).toBeLessThan(50);
      await sleep(100);
      expect(broker.seen).toHaveLength(2);
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-2');
    });

    it('asks again once the token is within the margin of expiry', async () => {
      broker.script(token('tok-1', 4), token('tok-2', 1800));
      const c = client({ refreshAheadMs: 0 });
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-1');
      // 4 s token: margin 1 s. Before it: cached; inside it: a new request.
      await sleep(1500);
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-1');
      expect(broker.seen).toHaveLength(1);
      await sleep(1800);
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-2');
      expect(broker.seen).toHaveLength(2);
    });

    it('retries a 503, waiting at least its Retry-After', async () => {
      broker.script(problem(503, 'token_unavailable', { 'retry-after': '1' }), token('tok-1', 60));
      const started = Date.now();
      expect((await client().getToken({ client: 'acme-prod' })).accessToken).toBe('tok-1');
      expect(broker.seen).toHaveLength(2);
      expect(broker.seen[1].at - broker.seen[0].at).toBeGreaterThanOrEqual(990);
      expect(Date.now() - started).toBeGreaterThanOrEqual(990);
    });

    it('gives up after maxAttempts with a typed, retryable error', async () => {
      broker.script(problem(503, 'credentials_rejected'));
      const err = await client({ maxAttempts: 3 })
        .getToken({ client: 'acme-prod' })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BrokerUnavailableError);
      expect(err).toMatchObject({
        code: 'credentials_rejected',
        status: 503,
        requestId: 'req-3',
        retryable: true,
      });
      expect(broker.seen).toHaveLength(3);
    });

    it.each([
      [403, 'forbidden', BrokerAuthError],
      [401, 'unauthenticated', BrokerAuthError],
      [404, 'unknown_client', BrokerRequestError],
      [400, 'client_required', BrokerRequestError],
    ])('%s %s: typed, not retried', async (status, code, type) => {
      broker.script(problem(status, code));
      const err = await client()
        .getToken({ client: 'acme-prod' })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(type);
      expect(err).toMatchObject({ code, status, message: `it is ${code}`, retryable: false });
      expect(broker.seen).toHaveLength(1);
    });

    it('a broker that cannot be reached: network_error after the retries', async () => {
      const url = broker.url;
      await broker.close();
      const err = await createBrokerClient({ baseUrl: url, apiKey: 'k', retryBaseMs: 5 })
        .getToken({ client: 'acme-prod' })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BrokerUnavailableError);
      expect((err as BrokerError).code).toBe('network_error');
      expect((err as BrokerError).message).toContain('ECONNREFUSED');
      broker = await StandIn.start(); // for afterEach
    });

    it('a broker that does not answer in time: timeout', async () => {
      broker.script({ ...token('tok-1', 60), delayMs: 1000 });
      const err = await client({ requestTimeoutMs: 150, maxAttempts: 2 })
        .getToken({ client: 'acme-prod' })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BrokerUnavailableError);
      expect(err).toMatchObject({ code: 'timeout', status: 0 });
      expect(broker.seen).toHaveLength(2);
    });

    it('never follows a redirect: the other origin receives nothing, the call fails once', async () => {
      const elsewhere = await StandIn.start();
      try {
        elsewhere.script(token('tok-elsewhere', 1800));
        broker.script({ status: 307, headers: { location: `${elsewhere.url}/token` } });
        const err = await client()
          .getToken({ client: 'acme-prod' })
          .catch((e: unknown) => e);
        expect(err).toMatchObject({ code: 'unexpected_redirect', retryable: false });
        broker.script({ status: 307, headers: { location: `${elsewhere.url}/orders` } });
        const orderErr = await client()
          .orders.create({ amount: 1 }, { client: 'acme-prod' })
          .catch((e: unknown) => e);
        expect(orderErr).toMatchObject({ code: 'unexpected_redirect', retryable: false });
        expect(broker.seen.map((s) => s.method)).toEqual(['GET', 'POST']);
        expect(elsewhere.seen).toEqual([]);
      } finally {
        await elsewhere.close();
      }
    });

    it('serves a still-valid token when the broker fails inside the margin', async () => {
      broker.script(token('tok-1', 4), problem(503, 'token_unavailable'));
      const c = client({ refreshAheadMs: 0 });
      await c.getToken({ client: 'acme-prod' });
      await sleep(3400); // inside the 1 s margin, still valid
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-1');
      // One try only, since a valid token was in hand: the caller did not wait for retries.
      expect(broker.seen).toHaveLength(2);
    });

    it('refuses bad arguments with a clear message', async () => {
      const c = client();
      await expect(c.getToken({ client: '' })).rejects.toThrow('client must be a non-empty string');
      await expect(c.getToken({ client: 'a', minTtl: -1 })).rejects.toThrow('minTtl must be');
      expect(() => createBrokerClient({ baseUrl: 'token-broker', apiKey: 'k' })).toThrow(
        'baseUrl must be an absolute http(s) URL',
      );
      for (const baseUrl of ['http://ops:s3cret@token-broker', 'http://s3cret@token-broker']) {
        let message = '';
        try {
          createBrokerClient({ baseUrl, apiKey: 'k' });
        } catch (err) {
          message = (err as Error).message;
        }
        expect(message).toContain('baseUrl must not contain a user name or password');
        expect(message).not.toContain('s3cret');
      }
      let unparsable = '';
      try {
        createBrokerClient({ baseUrl: 'http://ops:s3cret@[bad', apiKey: 'k' });
      } catch (err) {
        unparsable = (err as Error).message;
      }
      expect(unparsable).toContain('baseUrl must be an absolute http(s) URL');
      expect(unparsable).not.toContain('s3cret');
      expect(() => createBrokerClient({ baseUrl: broker.url, apiKey: ' ' })).toThrow(
        'apiKey must be a non-empty string',
      );
      expect(() =>
        createBrokerClient({ baseUrl: broker.url, apiKey: 'k', maxAttempts: 0 }),
      ).toThrow('maxAttempts must be a positive number');
      expect(broker.seen).toHaveLength(0);
    });
  });

  describe('service-account token file', () => {
    let dir: string;
    beforeEach(() => {
      dir = mkdtempSync(join(tmpdir(), 'tb-client-'));
    });
    afterEach(() => rmSync(dir, { recursive: true, force: true }));

    it('re-reads the file when the kubelet rotates it', async () => {
      const file = join(dir, 'token');
      writeFileSync(file, 'sa-token-1\n');
      broker.script(token('tok-1', 2), token('tok-2', 2));
      const c = createBrokerClient({ baseUrl: broker.url, serviceAccountTokenFile: file });
      await c.getToken({ client: 'acme-prod' });
      writeFileSync(file, 'sa-token-2-longer\n');
      await sleep(1700);
      await c.getToken({ client: 'acme-prod' });
      expect(broker.seen.map((s) => s.authorization)).toEqual([
        'Bearer sa-token-1',
        'Bearer sa-token-2-longer',
      ]);
    });

    it('after a 401 reads the file again and retries once', async () => {
      const file = join(dir, 'token');
      writeFileSync(file, 'old');
      utimesSync(file, 1_700_000_000, 1_700_000_000);
      broker.script(token('tok-1', 2), problem(401, 'unauthenticated'), token('tok-2', 60));
      const c = createBrokerClient({
        baseUrl: broker.url,
        serviceAccountTokenFile: file,
        refreshAheadMs: 0,
      });
      await c.getToken({ client: 'acme-prod' });
      // Same size and modification time: only the forced re-read after the 401 sees it.
      writeFileSync(file, 'new');
      utimesSync(file, 1_700_000_000, 1_700_000_000);
      await sleep(1600);
      expect((await c.getToken({ client: 'acme-prod' })).accessToken).toBe('tok-2');
      expect(broker.seen.map((s) => s.authorization)).toEqual([
        'Bearer old',
        'Bearer old',
        'Bearer new',
      ]);
    });

    it('a missing file is a clear error', async () => {
      const c = createBrokerClient({
        baseUrl: broker.url,
        serviceAccountTokenFile: join(dir, 'absent'),
      });
      await expect(c.getToken({ client: 'a' })).rejects.toThrow(
        /cannot read serviceAccountTokenFile .*absent: ENOENT/,
      );
    });
  });

  describe('orders.create', () => {
    const created: Answer = { status: 201, body: { id: 'ord-1' } };

    it('always sends an Idempotency-Key, a new UUID per order', async () => {
      broker.script(created);
      const c = client();
      const a = await c.orders.create({ amount: 1 }, { client: 'acme-prod' });
      const b = await c.orders.create({ amount: 1 }, { client: 'acme-prod' });
      expect(a).toMatchObject({ status: 201, body: { id: 'ord-1' }, replayed: false });
      expect(a.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
      expect(b.idempotencyKey).not.toBe(a.idempotencyKey);
      expect(broker.seen.map((s) => [s.method, s.url, s.idempotencyKey, s.body])).toEqual([
        ['POST', '/orders?client=acme-prod', a.idempotencyKey, '{"amount":1}'],
        ['POST', '/orders?client=acme-prod', b.idempotencyKey, '{"amount":1}'],
      ]);
    });

    it('reuses the given key across its own retries and reports a replay', async () => {
      broker.script(
        problem(503, 'idempotency_unavailable', { 'retry-after': '0' }),
        problem(409, 'order_in_flight'),
        { ...created, headers: { 'idempotent-replayed': 'true' } },
      );
      const res = await client().orders.create(
        { amount: 2 },
        { client: 'acme-prod', idempotencyKey: 'order-42' },
      );
      expect(res).toMatchObject({ status: 201, idempotencyKey: 'order-42', replayed: true });
      expect(broker.seen.map((s) => s.idempotencyKey)).toEqual([
        'order-42',
        'order-42',
        'order-42',
      ]);
    });

    it("the provider's own 4xx is an answer; the broker's problems are typed errors", async () => {
      broker.script(
        { status: 422, body: { error: 'amount too low' } },
        problem(409, 'order_outcome_unknown'),
        problem(422, 'idempotency_key_reused'),
      );
      const c = client();
      expect(await c.orders.create({}, { client: 'acme-prod' })).toMatchObject({
        status: 422,
        body: { error: 'amount too low' },
      });
      await expect(c.orders.create({}, { client: 'acme-prod' })).rejects.toBeInstanceOf(
        OrderOutcomeUnknownError,
      );
      await expect(c.orders.create({}, { client: 'acme-prod' })).rejects.toMatchObject({
        code: 'idempotency_key_reused',
        status: 422,
      });
      expect(broker.seen).toHaveLength(3);
    });

    it('refuses a key the broker would refuse, before sending', async () => {
      const c = client();
      await expect(
        c.orders.create({}, { client: 'acme-prod', idempotencyKey: ' padded ' }),
      ).rejects.toThrow('idempotencyKey must be 1-255 printable ASCII');
      expect(broker.seen).toHaveLength(0);
    });
  });
});
