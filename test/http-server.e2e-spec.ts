import { connect, type Socket } from 'node:net';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { freePort } from './support/ports';
import { type Stack, type StackBroker, type StackOptions, startStack } from './support/stack';
import { waitFor } from './support/wait';

const API_KEY = 'timeouts-test-key-0123456789abcdef';
const ADMIN_KEY = 'listener-admin-key-0123456789abcdef';
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

/** One answer read off a raw socket: status, lower-cased headers, body. */
interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * Sends `head` (a request line and headers, no terminating blank line) as raw bytes, so that the
 * target reaches the broker exactly as spelled, and reads one answer (by its Content-Length, or
 * until the broker closes).
 */
function raw(port: number, head: string, body = '', connection = 'close'): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    const parse = (closed: boolean): Answer | undefined => {
      const split = text.indexOf('\r\n\r\n');
      if (split < 0) return undefined;
      const [statusLine, ...lines] = text.slice(0, split).split('\r\n');
      const headers: Record<string, string> = {};
      for (const line of lines) {
        const colon = line.indexOf(':');
        headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
      }
      const answer = {
        status: Number(statusLine.split(' ')[1]),
        headers,
        body: text.slice(split + 4),
      };
      const length = Number(headers['content-length']);
      return closed || Buffer.byteLength(answer.body, 'latin1') >= length ? answer : undefined;
    };
    socket.on('data', (c: Buffer) => {
      text += c.toString('latin1');
      const answer = parse(false);
      if (answer === undefined) return;
      socket.destroy();
      resolve(answer);
    });
    socket.on('error', reject);
    socket.on('close', () => {
      const answer = parse(true);
      if (answer) resolve(answer);
      else reject(new Error(`no answer to ${head.split('\r\n')[0]}: ${text}`));
    });
    socket.write(`${head}\r\nHost: x\r\nConnection: ${connection}\r\n\r\n${body}`);
  });
}

/** Whether a new connection to `port` is refused (the listener has closed). */
function refused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.on('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.on('error', () => resolve(true));
  });
}

function get(port: number, target: string, method = 'GET'): Promise<Answer> {
  return raw(port, `${method} ${target} HTTP/1.1\r\nAuthorization: Bearer ${ADMIN_KEY}`);
}

/** Whether `a` came from the admin or metrics routes (their bodies), not a refusal. */
function fromAdminRoutes(a: Answer): boolean {
  return (
    a.body.includes('token_broker_') ||
    a.body.includes('"store"') ||
    a.body.includes('"fingerprint"') ||
    a.body.includes('"generation"') ||
    a.body.includes('changedCredentials')
  );
}

/** Request targets that may reach the metrics or admin routes, spelled every way we know. */
const SPELLINGS = [
  '/admin/clients',
  '/metrics',
  '/%61dmin/clients',
  '/%41dmin/clients',
  '/a%64min/clients',
  '/adm%69n/clients',
  '/admi%6E/clients',
  '/admin/%63lients',
  '/admin/client%73',
  '/ADMIN/clients',
  '/Admin/clients',
  '/%6detrics',
  '/%6Detrics',
  '/%4Detrics',
  '/metric%73',
  '/METRICS',
  '/admin%2Fclients',
  '/admin%2fclients',
  'http://x/admin/clients',
  'http://x/metrics',
  'HTTP://X/metrics',
  'http://x/%6detrics',
  '/token/../admin/clients',
  '/x/%2e%2e/metrics',
  '/x/../metrics',
  '/./metrics',
  '//admin/clients',
  '//metrics',
  '/admin//clients',
  '/admin;x/clients',
  '/metrics;x',
  '/metrics/',
  '/admin/clients/',
  '/metrics?x=1',
  '/%6detrics?x=1',
];

/** Admin actions, by every spelling that could reach them. */
const ACTIONS = [
  '/admin/clients/acme/refresh',
  '/%61dmin/clients/acme/refresh',
  'http://x/admin/clients/acme/refresh',
  '/admin/clients/acme/revoke',
  '/%61dmin/clients/acme/revoke',
  'http://x/admin/clients/acme/revoke',
  '/admin/reload',
  '/%61dmin/reload',
  '/admin/relo%61d',
  'http://x/admin/reload',
];

/**
 * The broker's HTTP front. Slowloris: a client that sends its headers (or its body) a byte at a time must be cut off
 * once `HTTP_HEADERS_TIMEOUT_MS` (or `HTTP_REQUEST_TIMEOUT_MS`) has passed, with a 408 problem,
 * instead of holding a connection for Node's defaults (60 s, 300 s), on either listener. The
 * admin listener: which routes answer is decided by the listener a request arrived on, however
 * its target is spelled (sent as raw bytes). Every error, the framework's own included, is
 * problem+json with the security headers and a request id; both listeners drain alike.
 */
/** The stack of both describes: one client, two API-key callers, short HTTP timeouts. */
async function startHttpStack(inProcess: boolean, metricsPort: number): Promise<Stack> {
  const options: StackOptions = {
    name: 'http-timeouts',
    inProcess,
    clients: ['acme'],
    callerAuth: {
      mode: 'api-key',
      callers: {
        'timeouts-test': { clients: ['*'], key: API_KEY },
        oncall: { clients: ['*'], scopes: ['token', 'forward', 'admin'], key: ADMIN_KEY },
      },
    },
    env: {
      LOG_LEVEL: 'warn',
      HTTP_HEADERS_TIMEOUT_MS: String(HEADERS_TIMEOUT_MS),
      HTTP_REQUEST_TIMEOUT_MS: String(REQUEST_TIMEOUT_MS),
      METRICS_PORT: String(metricsPort),
      SHUTDOWN_DRAIN_DELAY_MS: '500',
    },
  };
  return startStack(options);
}

describe('HTTP front: slow clients and the admin port', () => {
  let stack: Stack;
  let provider: ProviderEmulator;
  let broker: StackBroker;
  let metricsPort: number;

  // In the Jest process: the timeouts, listeners and answers are the app's own (bootstrap.ts).
  beforeAll(async () => {
    metricsPort = await freePort();
    stack = await startHttpStack(true, metricsPort);
    ({ provider, broker } = stack);
  }, 30_000);

  afterAll(async () => {
    await stack?.close();
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

  it('takes the deprecated METRICS_PORT as the admin port: /metrics, /health/* and /admin/* there, not the API', async () => {
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
  });

  it('still serves a client that sends its request promptly', async () => {
    const res = await fetch(`${broker.url}/token`, {
      headers: { authorization: `Bearer ${API_KEY}` },
    });
    expect(res.status).toBe(200);
  });

  it('never answers a metrics or admin route on the callers port, however the target is spelled; the admin port does', async () => {
    const onAdmin: Record<string, number> = {};
    for (const target of SPELLINGS) {
      const api = await get(broker.port, target);
      expect([target, api.status, fromAdminRoutes(api)]).toEqual([
        target,
        api.status === 400 ? 400 : 404,
        false,
      ]);
      expect([target, api.headers['content-type']]).toEqual([
        target,
        expect.stringContaining('application/problem+json'),
      ]);
      const admin = await get(metricsPort, target);
      expect([target, admin.status]).toEqual([target, expect.any(Number)]);
      expect(admin.status).toBeLessThan(500);
      onAdmin[target] = admin.status;
    }
    // The spellings the router takes for an admin route reach it on the admin port: the
    // callers' 404 above is the listener's, not an unroutable target's.
    expect(onAdmin).toMatchObject({
      '/admin/clients': 200,
      '/metrics': 200,
      '/%61dmin/clients': 200,
      '/%6detrics': 200,
      'http://x/admin/clients': 200,
      'http://x/metrics': 200,
    });
    const scraped = await get(metricsPort, '/metrics');
    expect(scraped.body).toContain('token_broker_');
    expect(JSON.parse((await get(metricsPort, '/admin/clients')).body)).toHaveProperty('store');
  });

  it('refuses the forced refresh, revoke and reload on the callers port by every spelling', async () => {
    const before = provider.stats.tokensIssued;
    for (const target of ACTIONS) {
      const api = await get(broker.port, target, 'POST');
      expect([target, api.status, fromAdminRoutes(api)]).toEqual([target, 404, false]);
    }
    expect(provider.stats.tokensIssued).toBe(before);
    const refreshed = await get(metricsPort, '/%61dmin/clients/acme/refresh', 'POST');
    expect(refreshed.status).toBe(200);
    expect(JSON.parse(refreshed.body)).toMatchObject({ client: 'acme', providerRequest: true });
  });

  it("answers the callers' routes on the callers port only, and the probes on both", async () => {
    for (const target of ['/token', '/%74oken', 'http://x/token', '/oauth2/token', '/orders']) {
      const admin = await get(metricsPort, target);
      expect([target, admin.status]).toEqual([target, 404]);
      expect(admin.body).not.toContain('access_token');
    }
    const ordered = await raw(
      metricsPort,
      `POST /orders?client=acme HTTP/1.1\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n` +
        'Content-Type: application/json\r\nContent-Length: 2',
      '{}',
    );
    expect(ordered.status).toBe(404);
    expect(provider.stats.orderRequests).toBe(0);
    expect((await get(broker.port, '/token')).status).toBe(200);
    // GET /token is the exact path only: other spellings reach the router, which has no such route.
    expect((await get(broker.port, 'http://x/token')).status).toBe(404);
    expect((await get(broker.port, '/%74oken')).status).toBe(404);
    for (const port of [broker.port, metricsPort]) {
      expect((await get(port, '/health/live')).status).toBe(200);
      expect((await get(port, '/health/ready')).status).toBe(200);
    }
  });

  it('answers a target that does not percent-decode, and every framework error, in problem+json with the security headers and a request id, echoing nothing', async () => {
    const cases: [number, string, string?][] = [
      [broker.port, 'GET /token%C0%AE?client=secret-looking-query HTTP/1.1'],
      [broker.port, 'GET /%C0%AE HTTP/1.1'],
      [broker.port, 'GET /orders%C0%AE HTTP/1.1'],
      [metricsPort, 'GET /metrics%C0%AE?x=secret-looking-query HTTP/1.1'],
      [metricsPort, 'GET /%C0%AE HTTP/1.1'],
      [broker.port, 'GET /no-such-route?x=secret-looking-query HTTP/1.1'],
      [metricsPort, 'GET /no-such-route?x=secret-looking-query HTTP/1.1'],
      [
        metricsPort,
        'POST /admin/reload?x=secret-looking-query HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 1',
        '{',
      ],
      [
        metricsPort,
        'POST /admin/reload HTTP/1.1\r\nContent-Type: text/xml\r\nContent-Length: 4',
        '<a/>',
      ],
      [
        metricsPort,
        'POST /admin/reload HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 5000000',
      ],
      [broker.port, 'GET /%C0%AE HTTP/1.1\r\nBad Header Line'],
    ];
    for (const [port, head, body] of cases) {
      const a = await raw(port, `${head}\r\nAuthorization: Bearer ${ADMIN_KEY}`, body);
      expect([head, a.status >= 400 && a.status < 500]).toEqual([head, true]);
      expect([head, a.headers['content-type']]).toEqual([
        head,
        expect.stringContaining('application/problem+json'),
      ]);
      expect(a.headers['x-content-type-options']).toBe('nosniff');
      expect(a.headers['content-security-policy']).toContain("default-src 'none'");
      expect(a.headers['x-frame-options']).toBe('DENY');
      expect(a.headers['x-request-id']).toMatch(/^[A-Za-z0-9._:-]+$/);
      const problem = JSON.parse(a.body) as { code: string; requestId: string };
      expect(problem.requestId).toBe(a.headers['x-request-id']);
      expect(a.body).not.toMatch(/%C0|secret-looking-query|no-such-route|orders|metrics/i);
    }
  });

  it('cuts a client trickling its headers off the admin port within HTTP_HEADERS_TIMEOUT_MS and a second', async () => {
    const started = Date.now();
    const socket = connect(metricsPort, '127.0.0.1');
    socket.on('error', () => undefined);
    const head = `GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ${'a'.repeat(200)}\r\n\r\n`;
    let i = 0;
    const timer = setInterval(() => {
      if (i < head.length && socket.writable) socket.write(head[i++]);
    }, 50);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    const closedAfterMs = await new Promise<number>((resolve) => {
      socket.on('close', () => resolve(Date.now() - started));
      // Node's default check interval (30 s) would hold it far longer: fail fast instead.
      setTimeout(() => socket.destroy(), HEADERS_TIMEOUT_MS + 4000).unref();
    });
    clearInterval(timer);
    expect(closedAfterMs).toBeGreaterThanOrEqual(HEADERS_TIMEOUT_MS - 50);
    // As on the callers' port: the deadline, Node's check interval (1 s), slack for a busy machine.
    expect(closedAfterMs).toBeLessThan(HEADERS_TIMEOUT_MS + 1000 + 1500);
    const answer = Buffer.concat(chunks).toString();
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer).toContain('x-content-type-options: nosniff');
  });

  // What main.ts alone does, on a real process: the start-up warning and the SIGTERM drain.
  describe('as a process', () => {
    beforeAll(async () => {
      await stack.close();
      metricsPort = await freePort();
      stack = await startHttpStack(false, metricsPort);
      ({ provider, broker } = stack);
    }, 30_000);

    it('warns that METRICS_PORT is deprecated, and drains both listeners alike: Connection: close while draining, then 503 shutting_down in problem+json', async () => {
      // Logged just after listening, through pino's batching destination (flushed within 200 ms).
      await waitFor(
        () =>
          broker.logs().some((l) => l.includes('METRICS_PORT (http.metricsPort) is deprecated')),
        { timeoutMs: 5000, what: 'the METRICS_PORT deprecation warning' },
      );
      // Requests whose headers are not complete yet: their connections stay open when the
      // listeners close (only idle ones are closed), and their requests arrive after.
      const late = [broker.port, metricsPort].map((port) => {
        const socket = connect(port, '127.0.0.1');
        socket.on('error', () => undefined);
        let text = '';
        socket.on('data', (c: Buffer) => (text += c.toString('latin1')));
        const answer = new Promise<string>((resolve) => socket.on('close', () => resolve(text)));
        socket.write('GET /health/live HTTP/1.1\r\nHost: x\r\n');
        return { socket, answer };
      });
      process.kill(broker.process!.pid!, 'SIGTERM');
      await waitFor(async () => (await get(broker.port, '/health/ready')).status === 503, {
        timeoutMs: 3000,
        what: 'the drain to begin',
      });
      for (const port of [broker.port, metricsPort]) {
        const a = await raw(port, 'GET /health/live HTTP/1.1', '', 'keep-alive');
        expect([port, a.status, a.headers.connection]).toEqual([port, 200, 'close']);
      }
      for (const port of [broker.port, metricsPort]) {
        await waitFor(() => refused(port), { timeoutMs: 3000, what: `port ${port} to close` });
      }
      for (const { socket, answer } of late) {
        expect(socket.destroyed).toBe(false);
        socket.write('\r\n');
        const text = await answer;
        expect(text).toMatch(/^HTTP\/1\.1 503 /);
        expect(text).toMatch(/\r\ncontent-type: application\/problem\+json/i);
        expect(text).toMatch(/\r\nconnection: close\r\n/i);
        expect(text).toMatch(/\r\nx-content-type-options: nosniff\r\n/i);
        expect(text).toMatch(/\r\nx-request-id: [\w-]+\r\n/i);
        expect(text).toContain('"code":"shutting_down"');
      }
    });
  });
});
