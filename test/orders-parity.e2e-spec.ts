import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { type BrokerProcess, spawnBroker } from './support/broker-process';
import { comparable, type RawAnswer } from './support/raw-answer';
import { freePort } from './support/ports';

const CREDS = { client_id: 'acme-merchant', client_secret: 'acme-very-secret' };
const API_KEY = 'orders-parity-key-0123456789abcdef';

jest.setTimeout(60_000);

/**
 * One POST on its own connection. `chunked` sends the body without `Content-Length`, which
 * `OrdersFastPath` leaves to Fastify; with a length, an ordinary order is the fast path's.
 */
function post(
  url: string,
  text: string | Buffer,
  headers: Record<string, string>,
  chunked: boolean,
): Promise<RawAnswer> {
  const body = Buffer.from(text);
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', agent: false, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    if (chunked) {
      req.write(body.subarray(0, 5));
      req.end(body.subarray(5));
    } else {
      req.setHeader('content-length', body.length);
      req.end(body);
    }
  });
}

/**
 * `POST /orders` has two fronts: `OrdersFastPath` on Node's request event for the ordinary
 * order, and the Fastify route for the rest (a chunked body is one). Both run one
 * `OrdersService`; this proves that what reaches the caller is the same bytes, for the
 * provider's answers (relayed, replayed) and for the broker's own problems, each pair with the
 * same X-Request-Id.
 */
describe('POST /orders parity: fast path and Fastify route', () => {
  let provider: ProviderEmulator;
  let broker: BrokerProcess;
  let dir: string;

  beforeAll(async () => {
    provider = await ProviderEmulator.start({
      credentials: { [CREDS.client_id]: CREDS.client_secret },
    });
    dir = mkdtempSync(join(tmpdir(), 'tb-orders-parity-'));
    const credentials = join(dir, 'credentials.json');
    writeFileSync(credentials, JSON.stringify(CREDS), { mode: 0o600 });
    const client = (id: string, baseUrl: string) => ({
      id,
      authUrl: provider.url,
      baseUrl,
      credentials: { file: credentials },
    });
    const configFile = join(dir, 'broker.json');
    writeFileSync(
      configFile,
      JSON.stringify({
        clients: [
          client('acme', provider.url),
          // Token endpoint up, checkout API on a port nobody listens on.
          client('dead', `http://127.0.0.1:${await freePort()}`),
        ],
        callerAuth: {
          mode: 'api-key',
          apiKeys: [
            {
              name: 'parity',
              sha256: createHash('sha256').update(API_KEY).digest('hex'),
              clients: ['*'],
            },
          ],
        },
      }),
    );
    broker = await spawnBroker({
      name: 'orders-parity',
      env: { BROKER_CONFIG_FILE: configFile, HOST: '127.0.0.1', LOG_LEVEL: 'warn' },
    });
    await broker.waitReady(15_000);
  });

  afterEach(() => provider.reset());

  afterAll(async () => {
    await broker?.stop();
    await provider?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** The same order through both fronts; `key` adds an Idempotency-Key. */
  async function both(
    name: string,
    body: string | Buffer,
    opts: { client?: string; key?: string } = {},
  ): Promise<{ fast: RawAnswer; fastify: RawAnswer }> {
    const headers: Record<string, string> = {
      authorization: `Bearer ${API_KEY}`,
      'content-type': 'application/json',
      'x-request-id': `parity-${name}`,
      ...(opts.key !== undefined && { 'idempotency-key': opts.key }),
    };
    const url = `${broker.url}/orders?client=${opts.client ?? 'acme'}`;
    const fast = await post(url, body, headers, false);
    const fastify = await post(url, body, headers, true);
    return { fast, fastify };
  }

  it('relays a created order alike (the provider names each order differently)', async () => {
    const { fast, fastify } = await both('created', '{"price":50000,"orderRef":"p-1"}');
    expect(fast.status).toBe(201);
    const { body: fastBody, ...fastRest } = comparable(fast);
    const { body: fastifyBody, ...fastifyRest } = comparable(fastify);
    expect(fastRest).toEqual(fastifyRest);
    expect(Object.keys(JSON.parse(fastBody))).toEqual(Object.keys(JSON.parse(fastifyBody)));
    expect(provider.stats.ordersCreated).toBe(2);
  });

  it.each([
    ['a business error', {}, '{"price":50}'],
    [
      'a provider failure with its own type and Retry-After',
      { kind: 'status', status: 503, body: 'down', contentType: 'text/plain', retryAfter: '7' },
      '{"price":50000}',
    ],
    ['an empty answer without a type', { kind: 'status', status: 502 }, '{"price":50000}'],
    [
      'bytes without a type',
      { kind: 'status', status: 500, body: 'oops', contentType: null },
      '{"price":50000}',
    ],
  ] as const)('relays %s byte for byte', async (_what, failure, body) => {
    if ('kind' in failure) provider.setKnobs({ ordersFailure: failure });
    const { fast, fastify } = await both(_what.replace(/\W+/g, '-'), body);
    expect(fast.status).toBeGreaterThanOrEqual(400);
    expect(comparable(fast)).toEqual(comparable(fastify));
  });

  it.each([
    ['a body that is not JSON', '{"price":', 400],
    ['a JSON array', '[1,2]', 400],
    ['a body that is not UTF-8', Buffer.from('{"note":"caf\u00e9"}', 'latin1'), 400],
  ])('refuses %s with the same problem', async (what, body, status) => {
    const { fast, fastify } = await both(what.replace(/\W+/g, '-'), body);
    expect(fast.status).toBe(status);
    expect(comparable(fast)).toEqual(comparable(fastify));
    expect(provider.stats.orders).toHaveLength(0);
  });

  it('replays a recorded answer alike, and refuses the key with another body alike', async () => {
    const headers = {
      authorization: `Bearer ${API_KEY}`,
      'content-type': 'application/json',
      'idempotency-key': 'parity-key-1',
    };
    const first = await post(
      `${broker.url}/orders?client=acme`,
      '{"price":50000,"orderRef":"k-1"}',
      { ...headers, 'x-request-id': 'parity-first' },
      false,
    );
    expect(first.status).toBe(201);
    const replay = await both('replay', '{"price":50000,"orderRef":"k-1"}', {
      key: 'parity-key-1',
    });
    expect(replay.fast.headers['idempotent-replayed']).toBe('true');
    expect(comparable(replay.fast)).toEqual(comparable(replay.fastify));
    expect(replay.fast.body.equals(first.body)).toBe(true);
    const reused = await both('reused', '{"price":1}', { key: 'parity-key-1' });
    expect(reused.fast.status).toBe(422);
    expect(comparable(reused.fast)).toEqual(comparable(reused.fastify));
    expect(provider.stats.ordersCreated).toBe(1);
  });

  it('answers an unreachable provider with the same 502 problem', async () => {
    const { fast, fastify } = await both('dead', '{"price":50000}', { client: 'dead' });
    expect(fast.status).toBe(502);
    expect(comparable(fast)).toEqual(comparable(fastify));
  });
});
