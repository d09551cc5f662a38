import { connect, type Socket } from 'node:net';
import { type Stack, startStack } from './support/stack';
import { metricValue } from './support/token-watch';
import { waitFor } from './support/wait';

// An in-process broker and an emulator: more than Jest's 5 s on a shared machine.
jest.setTimeout(60_000);

type Line = Record<string, unknown>;

/**
 * A caller that goes away mid-request or mid-answer, over a real socket to a broker listening
 * on 127.0.0.1: a quiet, named outcome (`client_closed`), never an error.
 */
describe('a caller closing its connection early (orders and the passthrough)', () => {
  let stack: Stack;

  beforeAll(async () => {
    stack = await startStack({
      name: 'client-closed',
      inProcess: true,
      env: { LOG_LEVEL: 'debug' },
    });
  });
  afterEach(() => stack.provider.reset());
  afterAll(async () => {
    await stack?.close();
  });

  const lines = (): Line[] => stack.brokers[0].logs().map((l) => JSON.parse(l) as Line);

  function open(): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = connect(stack.brokers[0].port, '127.0.0.1', () => resolve(socket));
      socket.once('error', reject);
    });
  }

  /** The audit line of the `n`th request closed early, once written. */
  function closedLine(trail: 'orders' | 'forward', n: number): Promise<Line> {
    return waitFor(
      () => lines().filter((l) => l.audit === trail && l.result === 'client_closed')[n - 1],
      { timeoutMs: 10_000, what: `the ${trail} audit line of a closed connection` },
    );
  }

  afterEach(() => {
    // Never logged as a failure of the broker's: no error line, no "unhandled error".
    expect(lines().filter((l) => l.level === 'error' || l.level === 'fatal')).toEqual([]);
  });

  it('mid-request (half a body sent): audited client_closed with 499, nothing sent upstream', async () => {
    const socket = await open();
    socket.write(
      'POST /orders HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n' +
        'Content-Length: 200\r\nExpect: 100-continue\r\n\r\n{"price":',
    );
    // Node answers 100 Continue as it hands the request to the app, whose admission runs before
    // the next I/O event: the body is being read when the close arrives.
    await new Promise((resolve) => socket.once('data', resolve));
    socket.destroy();
    const line = await closedLine('orders', 1);
    expect(line).toMatchObject({ status: 499, attempts: 0, caller: 'anonymous' });
    expect(line.undelivered).toBeUndefined();
    expect(stack.provider.stats.orderRequests).toBe(0);
    expect(
      lines().some(
        (l) => l.msg === 'the caller closed its connection before the answer was complete',
      ),
    ).toBe(true);
  });

  it('while the provider works on an order: audited client_closed with the status it would have had', async () => {
    stack.provider.setKnobs({ ordersLatencyMs: 500 });
    const socket = await open();
    const body = JSON.stringify({ price: 1200, localization: { currency: 'USD' } });
    socket.write(
      `POST /orders HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    await waitFor(() => stack.provider.stats.orderRequests > 0 || undefined, {
      timeoutMs: 10_000,
      what: 'the order at the provider',
    });
    socket.destroy();
    const line = await closedLine('orders', 2);
    expect(line).toMatchObject({ attempts: 1, undelivered: 'forwarded' });
    // The order exists at the provider: the audit line is what says so to the operator.
    expect(line.status).toBe(201);
    expect(stack.provider.stats.ordersCreated).toBe(1);
    stack.provider.setKnobs({ ordersLatencyMs: 0 });
  });

  it('mid-answer (a streamed passthrough answer): audited client_closed with 200, counted', async () => {
    const counted = () =>
      metricValue(stack.brokers[0].url, 'token_broker_forward_requests_total', {
        outcome: 'client_closed',
      });
    const before = await counted();
    const socket = await open();
    socket.write(
      `GET /provider/acme-prod/api/marketing/v1/large?bytes=${256 * 1024 * 1024} HTTP/1.1\r\nHost: broker\r\n\r\n`,
    );
    const first = await new Promise<Buffer>((resolve) => socket.once('data', resolve));
    expect(first.toString('latin1')).toMatch(/^HTTP\/1\.1 200 /);
    socket.destroy();
    const line = await closedLine('forward', 1);
    expect(line).toMatchObject({ status: 200, attempts: 1, undelivered: 'forwarded' });
    expect(line.path).toBe('/api/marketing/v1/large');
    expect(await counted()).toBe(before + 1);
  });
});
