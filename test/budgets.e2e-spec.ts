import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { info } from './support/redis/node';
import { type Stack, type StackBroker, startStack } from './support/stack';
import { metricValue } from './support/token-watch';
import { waitFor } from './support/wait';

// A Redis, a provider emulator and a broker process per test, on a shared machine.
jest.setTimeout(180_000);

const MiB = 1024 * 1024;
/** The Helm chart's memory limit. */
const CHART_MEMORY_LIMIT = 256 * MiB;
const ORDER_BYTES = MiB;
/** All of a slow order's body but its last byte: the broker holds it and waits for the rest. */
const MOST_OF_AN_ORDER = Buffer.alloc(ORDER_BYTES - 1, 0x20);

/** What the broker answered a slow request, once it did. */
interface Refusal {
  status: number;
  retryAfter: string | undefined;
  code: string | undefined;
}

interface SlowRequest {
  socket: Socket;
  /** Resolves when the answer's head (and problem body) came, or the socket closed without one. */
  answer: Promise<Refusal | undefined>;
  /** Resolves once what was written left this process, or the socket went away. */
  sent: Promise<void>;
}

/**
 * A request written over a raw socket whose body never completes: `declared` bytes announced
 * (or chunked, without a length), `body` sent, the rest withheld until the test closes it.
 */
function slowRequest(
  broker: StackBroker,
  key: string,
  path: string,
  body: Buffer | Buffer[],
  declared?: number,
): SlowRequest {
  const socket = connect(broker.port, '127.0.0.1');
  socket.on('error', () => undefined);
  let data = '';
  const answer = new Promise<Refusal | undefined>((resolve) => {
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      data += chunk;
      const head = /^HTTP\/1\.1 (\d{3})[^]*?\r\n\r\n/.exec(data);
      const code = /"code":"([a-z_]+)"/.exec(data)?.[1];
      if (!head || code === undefined) return;
      const retryAfter = /\r\nretry-after: *(\S+)/i.exec(head[0])?.[1];
      resolve({ status: Number(head[1]), retryAfter, code });
    });
    socket.once('close', () => resolve(undefined));
  });
  const length =
    declared === undefined ? 'Transfer-Encoding: chunked' : `Content-Length: ${declared}`;
  socket.write(
    `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
      `Content-Type: application/json\r\n${length}\r\n\r\n`,
  );
  const parts = Array.isArray(body) ? body : [body];
  const sent = new Promise<void>((resolve) => {
    socket.once('close', () => resolve());
    parts.forEach((part, i) => {
      const framed =
        declared === undefined
          ? Buffer.concat([
              Buffer.from(`${part.length.toString(16)}\r\n`),
              part,
              Buffer.from('\r\n'),
            ])
          : part;
      socket.write(framed, () => i === parts.length - 1 && resolve());
    });
  });
  return { socket, answer, sent };
}

/** Peak and current resident memory of a process, from `/proc`. */
function memoryOf(pid: number): { peak: number; now: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) =>
    Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)![1]) * 1024;
  return { peak: kib('VmHWM'), now: kib('VmRSS') };
}

/** Settles `promises` or gives up at the deadline: a refused socket may never drain. */
async function settled(promises: Promise<unknown>[], timeoutMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.all(promises),
    new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs))),
  ]);
  clearTimeout(timer);
}

function report(line: string): void {
  process.stdout.write(`[budgets] ${line}\n`);
}

const ORDERS = '/orders';
const PASSTHROUGH = '/provider/acme-prod/api/marketing/v1/echo';

describe('budgets per caller and per replica (broker processes, real Redis)', () => {
  let stack: Stack;
  let key: Record<string, string>;

  beforeAll(async () => {
    stack = await startStack({
      name: 'budgets',
      redis: 'standalone',
      replicas: 0,
      // Keyed POSTs through the passthrough: wider than the default list (marketing reads).
      clients: [
        { id: 'acme-prod', config: { forward: { allow: [{ prefix: '/api/marketing/v1/' }] } } },
      ],
      callerAuth: {
        mode: 'api-key',
        callers: {
          shop: { clients: ['acme-prod'], scopes: ['forward'] },
          other: { clients: ['acme-prod'], scopes: ['forward'] },
        },
      },
      env: { LOG_LEVEL: 'warn' },
    });
    key = stack.keys;
  });
  afterEach(async () => {
    await Promise.all(stack.brokers.map((b) => b.stop()));
    stack.provider.reset();
  });
  afterAll(async () => {
    await stack?.close();
  });

  const metric = (broker: StackBroker, name: string, labels?: Record<string, string>) =>
    metricValue(broker.url, name, labels);

  /** Waits until `broker` holds no body byte and no request: nothing leaked. */
  async function drained(broker: StackBroker): Promise<void> {
    await waitFor(
      async () =>
        (await metric(broker, 'token_broker_request_body_bytes')) === 0 &&
        (await metric(broker, 'token_broker_forwarding_in_flight')) === 0,
      { timeoutMs: 15_000, what: 'the body budget and in-flight counts back to 0' },
    );
  }

  async function order(broker: StackBroker, caller: string, headers: Record<string, string> = {}) {
    const res = await fetch(`${broker.url}${ORDERS}`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${key[caller]}`,
        'content-type': 'application/json',
        ...headers,
      },
      body: JSON.stringify({ amount: 100, currency: 'USD' }),
    });
    const text = await res.text();
    const code = /"code":"([a-z_]+)"/.exec(text)?.[1];
    return { status: res.status, retryAfter: res.headers.get('retry-after'), code };
  }

  it.each([
    ['the defaults', {}, 32],
    [
      'the body budget alone (no in-flight bound or rate limit, the whole budget per caller)',
      {
        ORDERS_MAX_IN_FLIGHT_PER_CALLER: '0',
        ORDERS_CALLER_RATE_PER_SECOND: '0',
        ORDERS_CLIENT_RATE_PER_SECOND: '0',
        ORDERS_BODY_BUDGET_CALLER_PERCENT: '100',
      },
      64,
    ],
  ] as const)(
    'holds 300 slow 1 MiB orders of one forward-only caller within the chart limit (256 MiB) with %s, refusing the excess with 429/503 and Retry-After, and frees all of it when they abort',
    async (what, env, admittedAtMost) => {
      const broker = await stack.addBroker({ env });
      const pid = broker.process!.pid!;
      const before = memoryOf(pid);
      const requests = Array.from({ length: 300 }, () =>
        slowRequest(broker, key.shop, ORDERS, MOST_OF_AN_ORDER, ORDER_BYTES),
      );
      let peakSampled = 0;
      await settled(
        requests.map((r) =>
          r.sent.finally(() => (peakSampled = Math.max(peakSampled, memoryOf(pid).now))),
        ),
        60_000,
      );
      // Every refusal is answered before its body is read; give the last ones time to arrive:
      // until all but the admitted bound are answered, or 5 s.
      const answers: Array<Refusal | undefined> = requests.map(() => undefined);
      requests.forEach((r, i) => void r.answer.then((a) => (answers[i] = a)));
      await waitFor(() => answers.filter((a) => a !== undefined).length >= 300 - admittedAtMost, {
        timeoutMs: 5000,
        intervalMs: 100,
        what: 'the refusals',
      }).catch(() => undefined);
      await sleep(500);
      // What the replica holds, by its own accounting. Counting the unanswered requests as
      // admitted read 41 against a bound of 32 once in CI: a refused connection is closed
      // unread, and the reset that close sends can lose the refusal before this client reads
      // it, so a few refused requests end unanswered (their sockets closed, not open).
      const inFlight = await metric(broker, 'token_broker_forwarding_in_flight', {
        route: 'orders',
      });
      const bodyBytes = await metric(broker, 'token_broker_request_body_bytes');
      const memory = memoryOf(pid);
      const refused = answers.filter((a): a is Refusal => a !== undefined);
      // Of the unanswered requests, those still open are the ones the replica holds; the rest
      // were closed (a refusal lost to the reset).
      const held = requests.filter((r, i) => answers[i] === undefined && !r.socket.destroyed);
      const byCode = new Map<string, number>();
      for (const a of refused)
        byCode.set(`${a.status} ${a.code}`, (byCode.get(`${a.status} ${a.code}`) ?? 0) + 1);
      report(
        `300 slow 1 MiB orders (${what}): RSS before ${(before.now / MiB).toFixed(0)} MiB, peak (VmHWM) ${(memory.peak / MiB).toFixed(0)} MiB, ` +
          `admitted ${inFlight} (${(bodyBytes / MiB).toFixed(0)} MiB of bodies held; ${held.length} connections open, ${300 - refused.length - held.length} closed unanswered), refused ${JSON.stringify(Object.fromEntries(byCode))}`,
      );
      expect(memory.peak).toBeLessThanOrEqual(CHART_MEMORY_LIMIT);
      expect(refused.length).toBeGreaterThan(0);
      for (const a of refused) {
        expect([429, 503]).toContain(a.status);
        expect(Number(a.retryAfter)).toBeGreaterThanOrEqual(1);
      }
      // The caller's share of the body budget (32 of the 64 MiB without a memory limit), or all of
      // it: at most that many admitted, holding at most that many bodies.
      expect(inFlight).toBeLessThanOrEqual(admittedAtMost);
      expect(bodyBytes).toBeLessThanOrEqual(admittedAtMost * ORDER_BYTES);
      expect(inFlight).toBeGreaterThan(0);
      // Seen from the callers: no more requests held open than that.
      expect(held.length).toBeLessThanOrEqual(admittedAtMost);
      // The callers give up: every byte and request is given back.
      for (const r of requests) r.socket.destroy();
      await drained(broker);
      expect((await order(broker, 'other')).status).toBe(201);
    },
  );

  it('bounds the requests one caller has in flight per replica (429 with Retry-After); other callers are unaffected', async () => {
    const broker = await stack.addBroker({
      env: { ORDERS_MAX_IN_FLIGHT_PER_CALLER: '2', FORWARD_MAX_IN_FLIGHT_PER_CALLER: '1' },
    });
    const held = [0, 1].map(() => slowRequest(broker, key.shop, ORDERS, Buffer.from('{'), 100));
    await waitFor(
      async () =>
        (await metric(broker, 'token_broker_forwarding_in_flight', { route: 'orders' })) === 2,
      { timeoutMs: 10_000, what: 'two orders in flight' },
    );
    expect(await order(broker, 'shop')).toEqual({
      status: 429,
      retryAfter: '1',
      code: 'order_caller_budget_exceeded',
    });
    expect((await order(broker, 'other')).status).toBe(201);
    // The passthrough has its own count.
    const passthrough = slowRequest(broker, key.shop, PASSTHROUGH, Buffer.from('{'), 100);
    await waitFor(
      async () =>
        (await metric(broker, 'token_broker_forwarding_in_flight', { route: 'forward' })) === 1,
      { timeoutMs: 10_000, what: 'one passthrough request in flight' },
    );
    const second = slowRequest(broker, key.shop, PASSTHROUGH, Buffer.from('{'), 100);
    expect(await second.answer).toMatchObject({
      status: 429,
      code: 'forward_caller_budget_exceeded',
    });
    expect(
      await metric(broker, 'token_broker_budget_refusals_total', {
        route: 'orders',
        caller: 'shop',
        budget: 'in_flight',
      }),
    ).toBe(1);
    for (const r of [...held, passthrough, second]) r.socket.destroy();
    await drained(broker);
    expect((await order(broker, 'shop')).status).toBe(201);
  });

  it('refuses a body that does not fit in the replica budget (503) before reading it, cuts off a chunked one that outgrows it, gives each caller only its share (429), and leaks nothing on abort', async () => {
    const broker = await stack.addBroker({
      env: {
        ORDERS_BODY_BUDGET_BYTES: String(3 * MiB),
        ORDERS_BODY_BUDGET_CALLER_PERCENT: '84',
        ORDERS_MAX_IN_FLIGHT_PER_CALLER: '0',
      },
    });
    expect(await metric(broker, 'token_broker_request_body_budget_bytes')).toBe(3 * MiB);
    const first = slowRequest(broker, key.shop, ORDERS, MOST_OF_AN_ORDER, ORDER_BYTES);
    const second = slowRequest(broker, key.shop, ORDERS, MOST_OF_AN_ORDER, ORDER_BYTES);
    await waitFor(
      async () => (await metric(broker, 'token_broker_request_body_bytes')) === 2 * ORDER_BYTES,
      { timeoutMs: 10_000, what: "two orders' bodies held" },
    );
    // shop holds 2 MiB of its 2.5 MiB share: its third is refused, another caller's is not.
    const third = slowRequest(broker, key.shop, ORDERS, Buffer.from('{'), ORDER_BYTES);
    expect(await third.answer).toEqual({
      status: 429,
      retryAfter: '1',
      code: 'order_caller_budget_exceeded',
    });
    const others = slowRequest(broker, key.other, ORDERS, MOST_OF_AN_ORDER, ORDER_BYTES);
    await waitFor(
      async () => (await metric(broker, 'token_broker_request_body_bytes')) === 3 * ORDER_BYTES,
      { timeoutMs: 10_000, what: 'the whole budget held' },
    );
    // The replica is full: refused before a byte of the body is read, whoever asks.
    const declared = slowRequest(broker, key.other, ORDERS, Buffer.from('{'), 64 * 1024);
    expect(await declared.answer).toEqual({
      status: 503,
      retryAfter: '1',
      code: 'order_body_budget_exhausted',
    });
    const small = await order(broker, 'other');
    expect(small).toMatchObject({ status: 503, code: 'order_body_budget_exhausted' });
    expect(
      await metric(broker, 'token_broker_budget_refusals_total', {
        route: 'orders',
        budget: 'body_bytes',
      }),
    ).toBeGreaterThanOrEqual(2);
    // One gives up: its megabyte is free again, and a chunked body may take it, but no more.
    first.socket.destroy();
    await waitFor(
      async () => (await metric(broker, 'token_broker_request_body_bytes')) === 2 * ORDER_BYTES,
      { timeoutMs: 10_000, what: 'the aborted body given back' },
    );
    const chunks = Array.from({ length: 24 }, () => Buffer.alloc(64 * 1024, 0x20));
    const chunked = slowRequest(broker, key.other, ORDERS, chunks);
    expect(await chunked.answer).toMatchObject({
      status: 503,
      code: 'order_body_budget_exhausted',
    });
    for (const r of [second, third, others, declared, chunked]) r.socket.destroy();
    await drained(broker);
    expect((await order(broker, 'shop')).status).toBe(201);
  });

  it('rate-limits POST /orders per caller and per client, fleet-wide through Redis (429 order_rate_limited with Retry-After)', async () => {
    const env = {
      ORDERS_CALLER_RATE_PER_SECOND: '3',
      ORDERS_CALLER_RATE_BURST: '0',
      ORDERS_CLIENT_RATE_PER_SECOND: '5',
      ORDERS_CLIENT_RATE_BURST: '0',
    };
    const [a, b] = [await stack.addBroker({ env }), await stack.addBroker({ env })];
    // Within one second: 3 of shop's go through, across both replicas, then it is refused.
    const shop = [];
    for (let i = 0; i < 5; i++) shop.push(await order(i % 2 ? b : a, 'shop'));
    const refusedShop = shop.filter((r) => r.status === 429);
    expect(shop.filter((r) => r.status === 201).length).toBeLessThanOrEqual(3);
    expect(refusedShop.length).toBeGreaterThanOrEqual(2);
    for (const r of refusedShop) {
      expect(r.code).toBe('order_rate_limited');
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
    }
    // Another caller has its own budget, up to the client's.
    const other = [];
    for (let i = 0; i < 5; i++) other.push(await order(i % 2 ? a : b, 'other'));
    expect(other[0].status).toBe(201);
    expect(other.some((r) => r.status === 429 && r.code === 'order_rate_limited')).toBe(true);
    expect(stack.provider.stats.orders.length).toBeLessThanOrEqual(2 * 5);
  });

  it('bounds the order Idempotency-Key records one caller keeps per client (429 idempotency_records_exceeded, nothing sent); repeats and unkeyed orders pass', async () => {
    const broker = await stack.addBroker({
      env: { ORDERS_IDEMPOTENCY_MAX_RECORDS_PER_CALLER: '2' },
    });
    const keys = [randomUUID(), randomUUID(), randomUUID()];
    expect((await order(broker, 'shop', { 'idempotency-key': keys[0] })).status).toBe(201);
    expect((await order(broker, 'shop', { 'idempotency-key': keys[1] })).status).toBe(201);
    const sent = stack.provider.stats.orders.length;
    const refused = await order(broker, 'shop', { 'idempotency-key': keys[2] });
    expect(refused).toMatchObject({ status: 429, code: 'idempotency_records_exceeded' });
    expect(Number(refused.retryAfter)).toBeGreaterThan(0);
    expect(stack.provider.stats.orders.length).toBe(sent);
    expect((await order(broker, 'shop', { 'idempotency-key': keys[0] })).status).toBe(201);
    expect((await order(broker, 'shop')).status).toBe(201);
    expect((await order(broker, 'other', { 'idempotency-key': keys[2] })).status).toBe(201);
    expect(
      await metric(broker, 'token_broker_budget_refusals_total', {
        route: 'orders',
        budget: 'idempotency_records',
      }),
    ).toBe(1);
  });

  it('keeps the Redis growth of 100 keyed passthrough calls with 1 MB answers within FORWARD_IDEMPOTENCY_MAX_BYTES_PER_CALLER (16 MiB), refusing the calls past it with 429 before sending them', async () => {
    const broker = await stack.addBroker();
    const address = stack.redis!.url!;
    const body = 'x'.repeat(1_000_000);
    const usedBefore = Number((await info(address, 'memory')).used_memory);
    const statuses = new Map<string, number>();
    let retryAfterMissing = 0;
    for (let i = 0; i < 100; i++) {
      const res = await fetch(`${broker.url}${PASSTHROUGH}`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${key.shop}`,
          'content-type': 'text/plain',
          'idempotency-key': randomUUID(),
        },
        body,
      });
      const text = await res.text();
      const code = /"code":"([a-z_]+)"/.exec(text)?.[1];
      const label = code === undefined ? String(res.status) : `${res.status} ${code}`;
      if (res.status === 429 && res.headers.get('retry-after') === null) retryAfterMissing++;
      statuses.set(label, (statuses.get(label) ?? 0) + 1);
    }
    const usedAfter = Number((await info(address, 'memory')).used_memory);
    const growth = usedAfter - usedBefore;
    report(
      `100 keyed passthrough calls with 1 MB answers: Redis used_memory grew ${(growth / MiB).toFixed(1)} MiB; answers ${JSON.stringify(Object.fromEntries(statuses))}; provider saw ${stack.provider.stats.calls.length}`,
    );
    // The budget counts what is stored, and the one answer in flight when it is reached may
    // pass it; Redis's allocator rounds each answer up by a few percent.
    expect(growth).toBeLessThanOrEqual((16 + 1) * MiB * 1.05);
    expect(statuses.get('429 idempotency_bytes_exceeded') ?? 0).toBeGreaterThan(50);
    expect(retryAfterMissing).toBe(0);
    expect(stack.provider.stats.calls.length).toBeLessThanOrEqual(18);
  });
});
