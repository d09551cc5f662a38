import { randomBytes, randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { brotliCompressSync, gunzipSync, gzipSync } from 'node:zlib';
import { type LoopbackServer, serveLoopback } from './support/loopback-server';
import { type Stack, startStack } from './support/stack';

// A Redis and a broker on a shared machine take more than Jest's 5 s to start.
jest.setTimeout(120_000);

const CLIENT = 'hostile';
const CALLER_KEY = randomBytes(32).toString('base64url');

/** How the stand-in provider hands the `Authorization` header it received back. */
const WAYS = [
  'verbatim',
  'gzip-unlabelled',
  'gzip',
  'base64',
  'base64url',
  'json-slash',
  'url-encoded',
  'lower-case',
  'hex-etag',
] as const;
type Way = (typeof WAYS)[number];

/** The echo in the form the stand-in puts it in the answer (before any gzip). */
function encoded(way: Way, header: string): string {
  switch (way) {
    case 'verbatim':
    case 'gzip-unlabelled':
    case 'gzip':
      return header;
    case 'base64':
      return Buffer.from(header).toString('base64');
    case 'base64url':
      return Buffer.from(header).toString('base64url');
    case 'json-slash':
      // PHP's json_encode: every "/" escaped.
      return header.replaceAll('/', '\\/');
    case 'url-encoded':
      return encodeURIComponent(header);
    case 'lower-case':
      return header.toLowerCase();
    case 'hex-etag':
      return Buffer.from(header).toString('hex');
  }
}

/** The answer the stand-in sends for `way`. */
function echo(way: Way, header: string): { headers: Record<string, string>; body: Buffer } {
  const json = { 'content-type': 'application/json' };
  const text = (seen: string) => Buffer.from(`{"ok":true,"seen":"${seen}"}`);
  const form = encoded(way, header);
  switch (way) {
    case 'gzip-unlabelled':
      return { headers: json, body: gzipSync(text(form)) };
    case 'gzip':
      return { headers: { ...json, 'content-encoding': 'gzip' }, body: gzipSync(text(form)) };
    case 'hex-etag':
      return { headers: { ...json, etag: `"${form}"` }, body: text('nothing') };
    case 'verbatim':
    case 'base64':
    case 'base64url':
    case 'json-slash':
    case 'url-encoded':
    case 'lower-case':
      return { headers: json, body: text(form) };
  }
}

/**
 * A provider that echoes the `Authorization` header it receives, the way the request body asks,
 * and issues tokens holding `/` and `+`, so that escaping and percent-encoding change them.
 */
class HostileProvider {
  readonly acceptEncodings: (string | undefined)[] = [];
  private token = '';
  private constructor(private readonly server: LoopbackServer) {}

  static async start(): Promise<HostileProvider> {
    const started: HostileProvider[] = [];
    const server = await serveLoopback((req, res) => started[0].handle(req, res));
    started.push(new HostileProvider(server));
    return started[0];
  }

  get url(): string {
    return this.server.url;
  }

  /** The `Authorization` header the broker sends with the current token. */
  get header(): string {
    return `Bearer ${this.token}`;
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.server.server.close(() => resolve()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url?.startsWith('/api/auth/v1/oauth/token')) {
        do this.token = `Op/${randomBytes(30).toString('base64')}`;
        while (!this.token.includes('+'));
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ access_token: this.token, expires_in: 3600 }));
        return;
      }
      this.acceptEncodings.push(req.headers['accept-encoding']);
      const asked = JSON.parse(Buffer.concat(chunks).toString() || '{}') as {
        way?: Way;
        chunked?: boolean;
        coding?: string;
      };
      if (asked.coding !== undefined) {
        // A clean answer in a given Content-Encoding, large enough to be streamed.
        const clean = Buffer.from(`{"items":"${'x'.repeat(200_000)}"}`);
        const body =
          asked.coding === 'br'
            ? brotliCompressSync(clean)
            : asked.coding === 'gzip'
              ? gzipSync(clean)
              : clean;
        res.writeHead(200, {
          'content-type': 'application/json',
          'content-encoding': asked.coding,
        });
        res.end(body);
        return;
      }
      const answer = echo(asked.way ?? 'verbatim', req.headers.authorization ?? '');
      res.writeHead(201, answer.headers);
      if (asked.chunked) {
        // No Content-Length: the broker streams the answer rather than reading it whole.
        res.write(answer.body.subarray(0, 7));
        res.end(answer.body.subarray(7));
      } else {
        res.end(answer.body);
      }
    });
  }
}

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

/** Whether what the caller received holds the echo, in the form the stand-in sent it. */
function relays(answer: Answer, way: Way, header: string): boolean {
  const form = encoded(way, header);
  let body = answer.body;
  // A compressed body relayed unlabelled is still the token to anyone who gunzips it.
  if (body[0] === 0x1f && body[1] === 0x8b) body = gunzipSync(body);
  return body.includes(form) || Object.values(answer.headers).some((v) => v.includes(form));
}

async function call(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const res = await fetch(url, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${CALLER_KEY}`,
      'content-type': 'application/json',
      ...headers,
    },
    body: JSON.stringify(body),
  });
  return {
    status: res.status,
    headers: Object.fromEntries(res.headers),
    body: Buffer.from(await res.arrayBuffer()),
  };
}

const ROUTES = [
  { name: 'passthrough, streamed', route: 'forward', keyed: false, chunked: true },
  { name: 'passthrough, whole', route: 'forward', keyed: false, chunked: false },
  { name: 'passthrough, keyed', route: 'forward', keyed: true, chunked: true },
  { name: 'POST /orders', route: 'orders', keyed: false, chunked: false },
  { name: 'POST /orders, keyed', route: 'orders', keyed: true, chunked: false },
] as const;

/**
 * A provider that echoes the `Authorization` header (in the clear, compressed, encoded or
 * escaped) to a caller that may only have calls forwarded: none of it reaches the caller, on
 * either route, keyed or not, and a keyed echo is neither stored nor replayed.
 */
describe('token echo screen against a hostile provider (in-process broker, real Redis)', () => {
  let provider: HostileProvider;
  let stack: Stack;
  let broker: string;
  const relayed = new Map<string, number>();

  beforeAll(async () => {
    provider = await HostileProvider.start();
    stack = await startStack({
      name: 'token-echo',
      inProcess: true,
      redis: 'standalone',
      cacheKey: true,
      clients: [
        {
          id: CLIENT,
          // Every method under both APIs: the suite screens answers, not the default list.
          config: {
            authUrl: provider.url,
            baseUrl: provider.url,
            forward: { allow: [{ prefix: '/api/checkout/v1/' }, { prefix: '/api/marketing/v1/' }] },
          },
        },
      ],
      callerAuth: {
        mode: 'api-key',
        callers: { shop: { clients: [CLIENT], scopes: ['forward'], key: CALLER_KEY } },
      },
      env: { LOG_LEVEL: 'fatal' },
    });
    broker = stack.broker.url;
  });

  afterAll(async () => {
    await stack?.close();
    await provider?.close();
    const lines = [...relayed].map(
      ([name, n]) => `  ${name}: echoes relayed: ${n} of ${WAYS.length}`,
    );
    process.stdout.write(`token echo screen:\n${lines.join('\n')}\n`);
  });

  it.each(ROUTES)(
    '$name: no echo reaches the caller, each is a 502 upstream_echoed_token, none is replayed',
    async ({ name, route, keyed, chunked }) => {
      const url =
        route === 'orders'
          ? `${broker}/orders?client=${CLIENT}`
          : `${broker}/provider/${CLIENT}/api/checkout/v1/echo`;
      const leaks: Way[] = [];
      const codes: string[] = [];
      const repeats: string[] = [];
      for (const way of WAYS) {
        const key = keyed ? { 'idempotency-key': randomUUID() } : undefined;
        const answer = await call(url, { way, chunked }, key);
        if (relays(answer, way, provider.header)) leaks.push(way);
        codes.push(`${way}: ${answer.status} ${problemCode(answer)}`);
        if (key) {
          const repeat = await call(url, { way, chunked }, key);
          if (relays(repeat, way, provider.header)) leaks.push(way);
          const replayed = repeat.headers['idempotent-replayed'] ?? 'not replayed';
          repeats.push(`${way}: ${repeat.status} ${problemCode(repeat)} ${replayed}`);
        }
      }
      relayed.set(name, new Set(leaks).size);
      expect(leaks).toEqual([]);
      const prefix = route === 'orders' ? 'order' : 'forward';
      // POST /orders returns no ETag: that answer reaches the caller without its echo.
      const dropped = (way: Way) => route === 'orders' && way === 'hex-etag';
      expect(codes).toEqual(
        WAYS.map(
          (way) => `${way}: ${dropped(way) ? '201 -' : `502 ${prefix}_upstream_echoed_token`}`,
        ),
      );
      // An echo was not stored: its repeat is refused as of unknown outcome, never replayed.
      const unknown = `409 ${prefix}_outcome_unknown not replayed`;
      expect(repeats).toEqual(
        keyed ? WAYS.map((way) => `${way}: ${dropped(way) ? '201 - true' : unknown}`) : [],
      );
    },
  );

  it('asks the provider for identity encoding, whatever the caller accepts', async () => {
    provider.acceptEncodings.length = 0;
    await call(
      `${broker}/provider/${CLIENT}/api/checkout/v1/echo`,
      { way: 'verbatim' },
      {
        'accept-encoding': 'gzip, br',
      },
    );
    await call(
      `${broker}/orders?client=${CLIENT}`,
      { way: 'verbatim' },
      {
        'accept-encoding': 'gzip',
      },
    );
    expect(provider.acceptEncodings).toEqual(['identity', 'identity']);
  });

  it.each(['gzip', 'br'])(
    'relays a clean %s answer decoded, without Content-Encoding or a stale Content-Length',
    async (coding) => {
      const answer = await call(
        `${broker}/provider/${CLIENT}/api/checkout/v1/clean`,
        { coding },
        {
          'accept-encoding': 'identity',
        },
      );
      expect(answer.status).toBe(200);
      expect(answer.headers['content-encoding']).toBeUndefined();
      const clean = `{"items":"${'x'.repeat(200_000)}"}`;
      expect([answer.body.length, answer.body.toString() === clean]).toEqual([clean.length, true]);
      if (answer.headers['content-length'] !== undefined) {
        expect(Number(answer.headers['content-length'])).toBe(answer.body.length);
      }
    },
  );

  it('refuses an answer in an encoding it cannot decode: 502 provider_bad_response, never raw', async () => {
    const answer = await call(`${broker}/provider/${CLIENT}/api/checkout/v1/clean`, {
      coding: 'x-unheard-of',
    });
    expect(answer.status).toBe(502);
    expect(problemCode(answer)).toBe('forward_provider_bad_response');
    // The value is the provider's to choose: it is not repeated to the caller.
    expect(answer.body.toString()).toContain('Content-Encoding');
    expect(answer.body.toString()).not.toContain('x-unheard-of');
    expect(answer.body.toString()).not.toContain('xxxxxxxx');
  });
});

function problemCode(answer: Answer): string {
  if (!answer.headers['content-type']?.startsWith('application/problem+json')) return '-';
  return (JSON.parse(answer.body.toString()) as { code: string }).code;
}
