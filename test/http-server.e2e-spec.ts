import { rmSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { type BrokerProcess, spawnBroker } from './support/broker-process';
import { writeBrokerConfig } from './support/broker-config';
import { freePort } from './support/ports';

const CREDS = { client_id: 'acme-merchant', client_secret: 'acme-very-secret' };
const API_KEY = 'timeouts-test-key-0123456789abcdef';
const HEADERS_TIMEOUT_MS = 1000;
const REQUEST_TIMEOUT_MS = 2000;

jest.setTimeout(30_000);

/**
 * A client that trickles `head`, one byte every `everyMs`, then `after` the same way, and
 * reports when the broker closed the connection and what it answered.
 */
function trickle(
  port: number,
  head: string,
  everyMs: number,
): Promise<{ closedAfterMs: number; answer: string }> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const socket: Socket = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let i = 0;
    const timer = setInterval(() => {
      if (i < head.length && socket.writable) socket.write(head[i++]);
    }, everyMs);
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearInterval(timer);
      resolve({ closedAfterMs: Date.now() - started, answer: Buffer.concat(chunks).toString() });
    });
    setTimeout(() => {
      clearInterval(timer);
      socket.destroy();
      reject(new Error('the broker never closed the slow connection'));
    }, 20_000).unref();
  });
}

/**
 * The broker's HTTP front. Slowloris: a client that sends its headers (or its body) a byte at a time must be cut off
 * once `HTTP_HEADERS_TIMEOUT_MS` (or `HTTP_REQUEST_TIMEOUT_MS`) has passed, with a 408 problem,
 * instead of holding a connection for Node's defaults (60 s, 300 s).
 */
describe('HTTP front: slow clients and the admin port', () => {
  let provider: ProviderEmulator;
  let broker: BrokerProcess;
  let dir: string;
  let metricsPort: number;

  beforeAll(async () => {
    provider = await ProviderEmulator.start({
      credentials: { [CREDS.client_id]: CREDS.client_secret },
    });
    let configFile: string;
    ({ dir, configFile } = writeBrokerConfig({
      name: 'http-timeouts',
      providerUrl: provider.url,
      credentials: CREDS,
      clientIds: ['acme'],
      callerAuth: { mode: 'api-key' },
      apiKeys: [{ name: 'timeouts-test', key: API_KEY, clients: ['*'] }],
    }));
    metricsPort = await freePort();
    broker = await spawnBroker({
      env: {
        BROKER_CONFIG_FILE: configFile,
        HOST: '127.0.0.1',
        LOG_LEVEL: 'warn',
        HTTP_HEADERS_TIMEOUT_MS: String(HEADERS_TIMEOUT_MS),
        HTTP_REQUEST_TIMEOUT_MS: String(REQUEST_TIMEOUT_MS),
        METRICS_PORT: String(metricsPort),
      },
    });
    await broker.waitReady(10_000);
  }, 30_000);

  afterAll(async () => {
    await broker?.stop();
    await provider?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('cuts off a client trickling its headers after HTTP_HEADERS_TIMEOUT_MS, with a 408 problem', async () => {
    const head = `GET /token HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\nX-Slow: ${'a'.repeat(200)}\r\n\r\n`;
    const { closedAfterMs, answer } = await trickle(broker.port, head, 100);
    // The deadline, plus Node's check interval (1 s here), plus slack for a busy machine.
    expect(closedAfterMs).toBeGreaterThanOrEqual(HEADERS_TIMEOUT_MS - 50);
    expect(closedAfterMs).toBeLessThan(HEADERS_TIMEOUT_MS + 1000 + 1500);
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer).toContain('application/problem+json');
    expect(answer).toContain('"code":"request_timeout"');
    expect(answer).toContain('HTTP_HEADERS_TIMEOUT_MS');
  });

  it('cuts off a client trickling an order body after HTTP_REQUEST_TIMEOUT_MS', async () => {
    const body = `{"ref":"${'x'.repeat(200)}"}`;
    const headers =
      `POST /orders?client=acme HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    const started = Date.now();
    const socket = connect(broker.port, '127.0.0.1');
    socket.on('error', () => undefined);
    socket.write(headers);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    let i = 0;
    const timer = setInterval(() => {
      if (i < body.length && socket.writable) socket.write(body[i++]);
    }, 100);
    const closedAfterMs = await new Promise<number>((resolve) =>
      socket.on('close', () => resolve(Date.now() - started)),
    );
    clearInterval(timer);
    expect(closedAfterMs).toBeGreaterThanOrEqual(REQUEST_TIMEOUT_MS - 50);
    expect(closedAfterMs).toBeLessThan(REQUEST_TIMEOUT_MS + 1000 + 1500);
    expect(provider.stats.orderRequests).toBe(0);
    expect(Buffer.concat(chunks).toString()).toMatch(/^HTTP\/1\.1 408 /);
  });

  it('takes the deprecated METRICS_PORT as the admin port: /metrics, /health/* and /admin/* there, not the API; a warning says to rename it', async () => {
    const onApi = await fetch(`${broker.url}/metrics`);
    expect(onApi.status).toBe(404);
    expect(await onApi.text()).not.toContain('token_broker_');
    const adminOnApi = await fetch(`${broker.url}/admin/clients`, {
      headers: { authorization: `Bearer ${API_KEY}` },
    });
    expect(adminOnApi.status).toBe(404);
    expect(adminOnApi.headers.get('content-type')).toContain('application/problem+json');
    await adminOnApi.arrayBuffer();
    const admin = `http://127.0.0.1:${metricsPort}`;
    const scraped = await fetch(`${admin}/metrics`);
    expect(scraped.status).toBe(200);
    expect(await scraped.text()).toContain('token_broker_');
    expect((await fetch(`${admin}/health/ready`)).status).toBe(200);
    expect((await fetch(`${admin}/health/live`)).status).toBe(200);
    // The admin routes answer there, to scope admin only (this key has the default scopes).
    const refused = await fetch(`${admin}/admin/clients`, {
      headers: { authorization: `Bearer ${API_KEY}` },
    });
    expect(refused.status).toBe(403);
    expect(((await refused.json()) as { code: string }).code).toBe('forbidden');
    for (const path of ['/token', '/orders', '/metricsx', '/adminx', '/oauth2/token']) {
      const res = await fetch(`${admin}${path}`, {
        headers: { authorization: `Bearer ${API_KEY}` },
      });
      expect([path, res.status]).toEqual([path, 404]);
    }
    expect((await fetch(`${broker.url}/health/ready`)).status).toBe(200);
    expect(
      broker.logs().some((l) => l.includes('METRICS_PORT (http.metricsPort) is deprecated')),
    ).toBe(true);
  });

  it('still serves a client that sends its request promptly', async () => {
    const res = await fetch(`${broker.url}/token`, {
      headers: { authorization: `Bearer ${API_KEY}` },
    });
    expect(res.status).toBe(200);
  });
});
