import { request } from 'node:http';
import { connect } from 'node:net';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { comparable, type RawAnswer } from './support/raw-answer';
import { type Stack, type StackBroker, startStack } from './support/stack';

const API_KEY = 'parity-test-key-0123456789abcdef';

/** One request on its own connection, with the raw headers and body bytes of the answer. */
function get(base: string, path: string, headers: Record<string, string>): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, { headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * One raw request on its own connection (`node:net`): the request line and headers exactly as
 * given, so that targets and headers no HTTP client would send reach the broker as written.
 */
function raw(port: number, head: string): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    socket.setTimeout(10_000, () => socket.destroy(new Error(`no answer to ${head}`)));
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => {
      const all = Buffer.concat(chunks);
      const end = all.indexOf('\r\n\r\n');
      if (end < 0) return reject(new Error(`no complete answer to ${JSON.stringify(head)}`));
      const [statusLine, ...lines] = all.subarray(0, end).toString('latin1').split('\r\n');
      const headers: Record<string, string> = {};
      for (const line of lines) {
        const colon = line.indexOf(':');
        headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
      }
      resolve({ status: Number(statusLine.split(' ')[1]), headers, body: all.subarray(end + 4) });
    });
    socket.end(`${head}\r\nConnection: close\r\n\r\n`);
  });
}

/**
 * `GET /token` has one front, on Node's request event (`TokenFront`), and a query string means
 * what `URLSearchParams` reads in it. Each pair sends the same request twice, once plain and
 * once with an escaped but equivalent query, with the same X-Request-Id: the bytes on the wire
 * must be the same, for tokens and problems. The broker runs in the Jest process.
 */
describe('GET /token: one front, every spelling of a query', () => {
  let stack: Stack;
  let provider: ProviderEmulator;
  let broker: StackBroker;

  beforeAll(async () => {
    stack = await startStack({
      name: 'token-front',
      inProcess: true,
      clients: ['acme-preprod', 'beta-preprod'],
      callerAuth: {
        mode: 'api-key',
        callers: { 'parity-test': { clients: ['acme-preprod'], key: API_KEY } },
      },
      knobs: { tokenLifetimeSeconds: 600 },
      env: { LOG_LEVEL: 'warn' },
    });
    ({ provider, broker } = stack);
  }, 30_000);

  afterAll(async () => {
    await stack?.close();
  });

  const auth = { authorization: `Bearer ${API_KEY}` };

  it.each([
    ['a token', '/token?client=acme-preprod', '/token?client=acme%2Dpreprod', auth],
    [
      'a token with min_ttl',
      '/token?client=acme-preprod&min_ttl=60',
      '/token?client=acme-preprod&min_ttl=%360',
      auth,
    ],
    ['no client named (400)', '/token?min_ttl=0', '/token?min_ttl=%30', auth],
    [
      'an unknown client (403 to a caller not granted it, as for one that exists)',
      '/token?client=nope',
      '/token?client=nop%65',
      auth,
    ],
    [
      'a bad min_ttl (400)',
      '/token?client=acme-preprod&min_ttl=abc',
      '/token?client=acme-preprod&min_ttl=ab%63',
      auth,
    ],
    [
      'a min_ttl at the refresh-ahead lead',
      '/token?client=acme-preprod&min_ttl=300',
      '/token?client=acme-preprod&min_ttl=%3300',
      auth,
    ],
    [
      'a min_ttl beyond the refresh-ahead lead (400)',
      '/token?client=acme-preprod&min_ttl=301',
      '/token?client=acme-preprod&min_ttl=%3301',
      auth,
    ],
    ['no credentials (401)', '/token?client=acme-preprod', '/token?client=acme%2Dpreprod', {}],
    [
      'a client not granted (403)',
      '/token?client=beta-preprod',
      '/token?client=beta%2Dpreprod',
      auth,
    ],
  ])('%s: same status, headers and body', async (_what, fast, full, headers) => {
    // A 200 body carries expires_in in whole seconds: retry a pair that straddled a second.
    let pair: [ReturnType<typeof comparable>, ReturnType<typeof comparable>] | undefined;
    for (let i = 0; i < 5; i++) {
      const h = { ...headers, 'x-request-id': `parity-${i}` };
      const a = comparable(await get(broker.url, fast, h));
      const b = comparable(await get(broker.url, full, h));
      pair = [a, b];
      if (a.body === b.body) break;
    }
    const [a, b] = pair!;
    expect(b).toEqual(a);
    expect(a.headers['x-request-id']).toMatch(/^parity-\d$/);
    expect(a.headers['content-length']).toBe(String(Buffer.byteLength(a.body, 'latin1')));
  });
  it('caps min_ttl at TOKEN_REFRESH_AHEAD_SECONDS, escaped or not: above it 400 naming the cap, at it a token from memory', async () => {
    // A fresh 600 s token is in memory; the refresh-ahead lead is the default 300 s.
    expect((await get(broker.url, '/token?client=acme-preprod', auth)).status).toBe(200);
    const requests = provider.stats.tokenRequests;
    for (const minTtl of ['301', '%3301', '599']) {
      const res = await get(broker.url, `/token?client=acme-preprod&min_ttl=${minTtl}`, auth);
      expect(res.status).toBe(400);
      const problem = JSON.parse(res.body.toString('utf8')) as { code: string; detail: string };
      expect(problem.code).toBe('invalid_request');
      expect(problem.detail).toContain('"min_ttl" must be a whole number of seconds from 0 to 300');
    }
    for (const minTtl of ['300', '%3300']) {
      const res = await get(broker.url, `/token?client=acme-preprod&min_ttl=${minTtl}`, auth);
      expect(res.status).toBe(200);
    }
    // None of these callers made the broker ask the provider for a token.
    expect(provider.stats.tokenRequests).toBe(requests);
  });

  /**
   * Request targets and headers an attacker inside the cluster can send raw. Each is sent as
   * written and with `acme-preprod` escaped as `acme%2Dpreprod`: both must answer alike, and
   * only the exact path `/token` with a valid `Bearer` credential may ever get a token.
   */
  const KEY = API_KEY;
  const q = 'client=acme-preprod';
  const variants: Array<[string, string, string, number]> = [
    ['the plain request', `GET /token?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 200],
    ['HTTP/1.0', `GET /token?${q} HTTP/1.0`, `Authorization: Bearer ${KEY}`, 200],
    ['a trailing slash', `GET /token/?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    ['a double slash', `GET //token?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    ['upper case', `GET /TOKEN?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    ['a ;suffix', `GET /token;x?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    // Not the path `/token`: the router's, which has no such route.
    ['a #suffix on the path', `GET /token#x?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    // The client id then ends in `#x`: outside this caller's grant, so 403 (an id the caller
    // may not use answers as one that does not exist would: no enumeration).
    ['a #suffix on the query', `GET /token?${q}#x HTTP/1.1`, `Authorization: Bearer ${KEY}`, 403],
    ['an escaped slash', `GET /token%2F?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    // Equivalent spellings of /token (RFC 3986 §6.2.2, RFC 9112 §3.2.2) are not served: the
    // front takes the exact path only, and the router has no /token route.
    ['an escaped path', `GET /%74oken?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 404],
    ['an escaped path, no credential', `GET /%74oken?${q} HTTP/1.1`, `X-Nothing: 1`, 404],
    [
      'an absolute-form target',
      `GET http://127.0.0.1/token?${q} HTTP/1.1`,
      `Authorization: Bearer ${KEY}`,
      404,
    ],
    [
      'an absolute-form target, no credential',
      `GET http://127.0.0.1/token?${q} HTTP/1.1`,
      `X-Nothing: 1`,
      404,
    ],
    ['HEAD', `HEAD /token?${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 200],
    ['HEAD, no credential', `HEAD /token?${q} HTTP/1.1`, `X-Nothing: 1`, 401],
    ['HTTP/1.0, no credential', `GET /token?${q} HTTP/1.0`, `X-Nothing: 1`, 401],
    ['lower-case bearer', `GET /token?${q} HTTP/1.1`, `Authorization: bearer ${KEY}`, 200],
    ['two spaces after Bearer', `GET /token?${q} HTTP/1.1`, `Authorization: Bearer  ${KEY}`, 200],
    ['a tab after Bearer', `GET /token?${q} HTTP/1.1`, `Authorization: Bearer\t${KEY}`, 401],
    ['Basic', `GET /token?${q} HTTP/1.1`, `Authorization: Basic ${KEY}`, 401],
    ['no credential', `GET /token?${q} HTTP/1.1`, `X-Nothing: 1`, 401],
    [
      'a good then a bad Authorization',
      `GET /token?${q} HTTP/1.1`,
      `Authorization: Bearer ${KEY}\r\nAuthorization: Bearer nope`,
      401,
    ],
    [
      'a bad then a good Authorization',
      `GET /token?${q} HTTP/1.1`,
      `Authorization: Bearer nope\r\nAuthorization: Bearer ${KEY}`,
      401,
    ],
    ['a trailing &', `GET /token?${q}& HTTP/1.1`, `Authorization: Bearer ${KEY}`, 200],
    ['a leading &', `GET /token?&${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 200],
    ['a repeated client', `GET /token?${q}&${q} HTTP/1.1`, `Authorization: Bearer ${KEY}`, 400],
    ['client[]', `GET /token?client[]=acme-preprod HTTP/1.1`, `Authorization: Bearer ${KEY}`, 400],
    ['CLIENT', `GET /token?CLIENT=acme-preprod HTTP/1.1`, `Authorization: Bearer ${KEY}`, 400],
    ['an empty min_ttl', `GET /token?${q}&min_ttl= HTTP/1.1`, `Authorization: Bearer ${KEY}`, 200],
    [
      'a ; between parameters',
      `GET /token?${q};min_ttl=5 HTTP/1.1`,
      `Authorization: Bearer ${KEY}`,
      403,
    ],
  ];

  it.each(variants)(
    '%s: the same answer with the query escaped',
    async (_what, line, headerLines, status) => {
      const head = (l: string, i: number) =>
        `${l}\r\nHost: 127.0.0.1\r\nX-Request-Id: raw-${i}\r\n${headerLines}`;
      let pair: [ReturnType<typeof comparable>, ReturnType<typeof comparable>] | undefined;
      for (let i = 0; i < 5; i++) {
        const a = comparable(await raw(broker.port, head(line, i)));
        const b = comparable(
          await raw(broker.port, head(line.replace('acme-preprod', 'acme%2Dpreprod'), i)),
        );
        pair = [a, b];
        if (a.body === b.body) break;
      }
      const [a, b] = pair!;
      expect(b).toEqual(a);
      expect(a.status).toBe(status);
      if (status !== 200) expect(a.body).not.toContain('access_token');
    },
  );

  it('refuses a request with two Authorization headers, naming the problem', async () => {
    for (const order of [
      [`Bearer ${KEY}`, 'Bearer nope'],
      ['Bearer nope', `Bearer ${KEY}`],
      [`Bearer ${KEY}`, `Bearer ${KEY}`],
    ]) {
      const a = await raw(
        broker.port,
        `GET /token?${q} HTTP/1.1\r\nHost: x\r\nAuthorization: ${order[0]}\r\nauthorization: ${order[1]}`,
      );
      expect(a.status).toBe(401);
      expect(JSON.parse(a.body.toString()).detail).toMatch(/one Authorization header/);
    }
  });
});
