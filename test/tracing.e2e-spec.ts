import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { type Stack, type StackBroker, startStack } from './support/stack';
import { delay, waitFor } from './support/wait';

const CREDS = { client_id: 'trace-merchant', client_secret: randomBytes(12).toString('hex') };
const CLIENT = 'traced';

/** One span as OTLP/HTTP JSON carries it (ids in hex). */
interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes?: Array<{ key: string; value: Record<string, unknown> }>;
}

/** A real OTLP/HTTP receiver: collects every span the broker exports as JSON. */
class OtlpReceiver {
  readonly spans: OtlpSpan[] = [];
  serviceNames = new Set<string>();
  private constructor(private readonly server: Server) {}

  static async start(): Promise<OtlpReceiver> {
    const server = createServer();
    const receiver = new OtlpReceiver(server);
    server.on('request', (req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        if (req.url === '/v1/traces' && req.method === 'POST') {
          receiver.take(JSON.parse(Buffer.concat(chunks).toString('utf8')));
          res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        } else {
          res.writeHead(404).end();
        }
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return receiver;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  byTrace(traceId: string): OtlpSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  named(name: string | RegExp): OtlpSpan[] {
    return this.spans.filter((s) =>
      typeof name === 'string' ? s.name === name : name.test(s.name),
    );
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private take(body: {
    resourceSpans?: Array<{
      resource?: { attributes?: Array<{ key: string; value: { stringValue?: string } }> };
      scopeSpans?: Array<{ spans?: OtlpSpan[] }>;
    }>;
  }): void {
    for (const rs of body.resourceSpans ?? []) {
      const service = rs.resource?.attributes?.find((a) => a.key === 'service.name');
      if (service?.value.stringValue) this.serviceNames.add(service.value.stringValue);
      for (const ss of rs.scopeSpans ?? []) this.spans.push(...(ss.spans ?? []));
    }
  }
}

function traceparent(): { header: string; traceId: string; spanId: string } {
  const traceId = randomBytes(16).toString('hex');
  const spanId = randomBytes(8).toString('hex');
  return { header: `00-${traceId}-${spanId}-01`, traceId, spanId };
}

/** Children of `parent` in `spans`. */
function childrenOf(spans: OtlpSpan[], parent: OtlpSpan): OtlpSpan[] {
  return spans.filter((s) => s.parentSpanId === parent.spanId && s.traceId === parent.traceId);
}

/**
 * OpenTelemetry traces (issue #16): a broker started with the standard OTEL_* variables exports
 * spans over OTLP/HTTP to a receiver this test runs. A caller's W3C `traceparent` is continued
 * by a `GET /token` that waits and by `POST /orders` (and passed on to the provider as the
 * child's context); the refresh pass has its lock, provider request and fenced write as child
 * spans, with the Redis commands and the HTTP call below them; Secrets Manager reads are
 * spans; an L1 hit creates none.
 *
 * The broker is a child process: tracing starts in main.ts, from the OTEL_* variables, before
 * the app and the libraries it instruments (ioredis, undici, the AWS SDK) are loaded, and its
 * tracer provider is global to the process.
 */
describe('OpenTelemetry traces (real broker, OTLP/HTTP receiver)', () => {
  let receiver: OtlpReceiver;
  let set: Stack;
  let provider: ProviderEmulator;
  let broker: StackBroker;

  beforeAll(async () => {
    receiver = await OtlpReceiver.start();
    set = await startStack({
      name: 'traced',
      replicas: 0,
      redis: 'standalone',
      clients: [{ id: CLIENT, credentials: CREDS }],
      secrets: 'secrets-manager',
      env: {
        LOG_LEVEL: 'warn',
        TOKEN_BACKOFF_BASE_MS: '300',
        TOKEN_BACKOFF_MAX_MS: '600',
        TOKEN_WAIT_TIMEOUT_MS: '8000',
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
        OTEL_BSP_SCHEDULE_DELAY: '100',
        OTEL_SERVICE_NAME: 'token-broker-under-test',
      },
    });
    provider = set.provider;
    // No token at start-up: the first request fails, so the first caller has to wait.
    provider.failNextTokenRequests(2, { kind: 'status', status: 503 });
    broker = await set.addBroker({ name: 'traced-broker', wait: 'none' });
  }, 30_000);

  afterAll(async () => {
    await set?.close();
    await receiver?.close();
  });

  const waiting = traceparent();

  it('a GET /token that waits continues the caller’s trace', async () => {
    // Sent before the broker has a token (its first provider requests fail).
    const res = await waitFor(
      async () =>
        request(`${broker.url}/token`, { headers: { traceparent: waiting.header } }).catch(
          () => undefined,
        ),
      { timeoutMs: 15_000, intervalMs: 20, what: 'the broker to listen' },
    );
    expect(res.statusCode).toBe(200);
    await res.body.dump();
    const [wait] = await waitFor(() => nonEmpty(receiver.named('GET /token (wait)')), {
      timeoutMs: 5000,
      what: 'the wait span',
    });
    expect(wait).toMatchObject({ traceId: waiting.traceId, parentSpanId: waiting.spanId });
    expect(wait.kind).toBe(2); // SERVER
    expect(receiver.serviceNames).toContain('token-broker-under-test');
  });

  it('the refresh pass has its lock, provider request and fenced write as children', async () => {
    const fetched = await waitFor(
      () =>
        receiver
          .named('token.refresh')
          .find((r) =>
            childrenOf(receiver.spans, r).some((c) => c.name === 'provider.token_request'),
          ),
      { timeoutMs: 5000, what: 'a refresh span that asked the provider' },
    );
    const children = childrenOf(receiver.spans, fetched).map((c) => c.name);
    expect(children).toEqual(expect.arrayContaining(['token.lock', 'provider.token_request']));
    await waitFor(
      () =>
        receiver
          .named('token.refresh')
          .some((r) =>
            childrenOf(receiver.spans, r).some((c) => c.name === 'token.store.write_fenced'),
          ),
      { timeoutMs: 5000, what: 'a refresh span with its fenced write' },
    );
    // Below them: the HTTP request to the token endpoint (undici) and the Redis commands (ioredis).
    const [grant] = childrenOf(receiver.spans, fetched).filter(
      (c) => c.name === 'provider.token_request',
    );
    const http = childrenOf(receiver.spans, grant);
    expect(http.map((s) => s.name)).toEqual(
      expect.arrayContaining([expect.stringMatching(/^POST/)]),
    );
    const lock = childrenOf(receiver.spans, fetched).find((c) => c.name === 'token.lock')!;
    expect(childrenOf(receiver.spans, lock).length).toBeGreaterThan(0);
  });

  it('reads the credentials from Secrets Manager in a span of the AWS SDK', async () => {
    const reads = await waitFor(() => nonEmpty(receiver.named(/GetSecretValue/)), {
      timeoutMs: 5000,
      what: 'a Secrets Manager span',
    });
    expect(reads[0].name).toContain('SecretsManager');
  });

  it('an L1 hit creates no span', async () => {
    const hits = Array.from({ length: 50 }, () => traceparent());
    for (const t of hits) {
      const res = await request(`${broker.url}/token`, { headers: { traceparent: t.header } });
      expect(res.statusCode).toBe(200);
      await res.body.dump();
    }
    // Then a traced order: once its spans arrive, everything exported before them has too.
    const marker = traceparent();
    const res = await request(`${broker.url}/orders`, {
      method: 'POST',
      headers: { traceparent: marker.header, 'content-type': 'application/json' },
      body: JSON.stringify({ price: 50_000, orderRef: 'trace-marker' }),
    });
    expect(res.statusCode).toBe(201);
    await res.body.dump();
    await waitFor(() => nonEmpty(receiver.byTrace(marker.traceId)), {
      timeoutMs: 5000,
      what: 'the marker order’s spans',
    });
    await delay(300);
    const hitTraces = new Set(hits.map((t) => t.traceId));
    expect(receiver.spans.filter((s) => hitTraces.has(s.traceId))).toEqual([]);
  });

  it('POST /orders continues the caller’s trace and passes it on to the provider', async () => {
    const caller = traceparent();
    const res = await request(`${broker.url}/orders`, {
      method: 'POST',
      headers: { traceparent: caller.header, 'content-type': 'application/json' },
      body: JSON.stringify({ price: 50_000, orderRef: 'traced-order' }),
    });
    expect(res.statusCode).toBe(201);
    await res.body.dump();
    const [server] = await waitFor(
      () => nonEmpty(receiver.byTrace(caller.traceId).filter((s) => s.name === 'POST /orders')),
      { timeoutMs: 5000, what: 'the orders span' },
    );
    expect(server.parentSpanId).toBe(caller.spanId);
    const [outgoing] = await waitFor(
      () => nonEmpty(childrenOf(receiver.spans, server).filter((s) => /^POST/.test(s.name))),
      { timeoutMs: 5000, what: 'the provider call span' },
    );
    // The provider received the broker's child context: same trace, the HTTP span as parent,
    // one traceparent only.
    const order = provider.stats.orders.find(
      (o) => (o.body as { orderRef?: string }).orderRef === 'traced-order',
    );
    expect(order?.headers.traceparent).toBe(`00-${caller.traceId}-${outgoing.spanId}-01`);
  });

  it('a passthrough GET continues the caller’s trace and passes it on to the provider', async () => {
    const caller = traceparent();
    const res = await request(`${broker.url}/provider/${CLIENT}/api/marketing/v1/offers?traced=1`, {
      headers: { traceparent: caller.header },
    });
    expect(res.statusCode).toBe(200);
    await res.body.dump();
    const [server] = await waitFor(
      () =>
        nonEmpty(
          receiver
            .byTrace(caller.traceId)
            .filter((s) => s.name === 'GET /provider/{client}/{providerPath}'),
        ),
      { timeoutMs: 5000, what: 'the passthrough span' },
    );
    expect(server.parentSpanId).toBe(caller.spanId);
    const [outgoing] = await waitFor(
      () => nonEmpty(childrenOf(receiver.spans, server).filter((s) => /^GET/.test(s.name))),
      { timeoutMs: 5000, what: 'the provider call span' },
    );
    const call = provider.stats.calls.find((c) => c.query === 'traced=1');
    expect(call?.headers.traceparent).toBe(`00-${caller.traceId}-${outgoing.spanId}-01`);
  });

  it('exports Redis commands with their keys only and URLs without their query', () => {
    const attributes = receiver.spans.flatMap((s) => s.attributes ?? []);
    const statements = attributes
      .filter((a) => a.key === 'db.query.text' || a.key === 'db.statement')
      .map((a) => String(a.value.stringValue));
    // The refresh wrote a sealed record and took a lock with a random value: neither is here.
    expect(statements.length).toBeGreaterThan(0);
    expect(statements.filter((s) => !/^[a-z_]+( tb:\S+)*$/.test(s))).toEqual([]);
    expect(statements.some((s) => s.startsWith('evalsha tb:{traced}:'))).toBe(true);
    const urls = attributes.filter((a) => a.key.startsWith('url.'));
    expect(urls.some((a) => a.key === 'url.full')).toBe(true);
    expect(urls.filter((a) => a.key === 'url.query' || /\?/.test(JSON.stringify(a.value)))).toEqual(
      [],
    );
  });
});

function nonEmpty<T>(items: T[]): T[] | undefined {
  return items.length > 0 ? items : undefined;
}
