import { createHash } from 'node:crypto';
import { request } from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { type BrokerProcess, spawnBroker } from './support/broker-process';

const CREDS = { client_id: 'acme-merchant', client_secret: 'acme-very-secret' };
const API_KEY = 'parity-test-key-0123456789abcdef';

interface RawAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

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

/** What must match between the two fronts: everything but the date. */
function comparable(a: RawAnswer) {
  const headers = { ...a.headers };
  delete headers.date;
  return { status: a.status, headers, body: a.body.toString('latin1') };
}

/**
 * `GET /token` has two fronts: the fast path on Node's request event and the Fastify route for
 * what the fast path declines (an escaped query value is one). Both answer through one
 * `TokenResponder`; this proves the bytes on the wire are the same, for tokens and problems.
 * Each pair sends the same request twice, once plain (fast path) and once with an escaped but
 * equivalent query (Fastify), with the same X-Request-Id.
 */
describe('GET /token parity: fast path and Fastify route', () => {
  let provider: ProviderEmulator;
  let broker: BrokerProcess;
  let dir: string;

  beforeAll(async () => {
    provider = await ProviderEmulator.start({
      credentials: { [CREDS.client_id]: CREDS.client_secret },
      knobs: { tokenLifetimeSeconds: 600 },
    });
    dir = mkdtempSync(join(tmpdir(), 'token-parity-'));
    const credentials = join(dir, 'credentials.json');
    writeFileSync(credentials, JSON.stringify(CREDS));
    const config = join(dir, 'broker.json');
    writeFileSync(
      config,
      JSON.stringify({
        clients: [
          {
            id: 'acme-preprod',
            authUrl: provider.url,
            baseUrl: provider.url,
            credentials: { file: credentials },
          },
          {
            id: 'beta-preprod',
            authUrl: provider.url,
            baseUrl: provider.url,
            credentials: { file: credentials },
          },
        ],
        callerAuth: {
          mode: 'api-key',
          apiKeys: [
            {
              name: 'parity-test',
              sha256: createHash('sha256').update(API_KEY).digest('hex'),
              clients: ['acme-preprod'],
            },
          ],
        },
      }),
    );
    broker = await spawnBroker({
      env: {
        BROKER_CONFIG_FILE: config,
        HOST: '127.0.0.1',
        LOG_LEVEL: 'warn',
      },
    });
    await broker.waitReady(10_000);
  }, 30_000);

  afterAll(async () => {
    await broker?.stop();
    await provider?.close();
    rmSync(dir, { recursive: true, force: true });
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
      'a min_ttl beyond the lifetime (503)',
      '/token?client=acme-preprod&min_ttl=3600',
      '/token?client=acme-preprod&min_ttl=%33600',
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
});
