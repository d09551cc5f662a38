import { type ChildProcess, fork } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { PROVIDER_ORDERS_PATHS, ProviderEmulator } from '../emulator/provider-emulator';

/** One measured configuration, as the main bench harness prints it. */
export interface OrdersBenchRow {
  name: string;
  reqPerSec: number;
  p50Ms: number;
  p99Ms: number;
}

/** Options of {@link benchOrders}. */
export interface OrdersBenchOptions {
  /** Length of each measured run. */
  durationSec: number;
  /** Concurrent connections autocannon keeps open (same for both targets). */
  connections: number;
  /**
   * Interleaved rounds (direct, broker, direct, broker...) averaged into one row per target,
   * so drift on a shared machine hits both alike.
   * @default 3
   */
  rounds?: number;
  /**
   * Also measure the broker with a unique `Idempotency-Key` per request (in-memory store), as
   * a third row.
   * @default false
   */
  withIdempotencyKey?: boolean;
}

const CREDENTIALS = { client_id: 'bench-merchant', client_secret: 'bench-secret-value' };

/** A create-order body shaped like the provider plugin's (SPEC.md), about 600 bytes. */
const ORDER = JSON.stringify({
  merchantConfig: {
    cancelUrl: 'https://shop.example.test/checkout/cancel',
    confirmationUrl: 'https://shop.example.test/checkout/confirm',
  },
  integrationId: 'bench-integration',
  price: 129_900,
  orderItems: [
    { name: 'Road bike', sku: 'RB-100', quantity: 1, price: 119_900 },
    { name: 'Helmet', sku: 'HM-7', quantity: 1, price: 10_000 },
  ],
  localization: { country: 'US', currency: 'USD', locale: 'en-US' },
  billingContact: {
    firstName: 'Ada',
    lastName: 'Lovelace',
    email: 'ada@example.test',
    phone: '+1 555 0100',
    address: { street1: '1 Main St', city: 'Springfield', region: 'IL', postalCode: '62701' },
  },
});

/** Argument that makes this module, forked, run the emulator instead of a benchmark. */
const EMULATOR_ARG = '--orders-bench-emulator';

/**
 * `POST /orders` through one broker process (in-memory stores, no Redis) against the same POST
 * made directly to the provider emulator, same autocannon settings, interleaved.
 *
 * The emulator runs in a process of its own, like a real provider: were it in the load
 * generator's process, direct calls would never wait for another process to be scheduled
 * while brokered ones would, and the comparison would measure the operating system.
 *
 * Build first (`npm run build`); this module starts `dist/main.js`.
 */
export async function benchOrders(opts: OrdersBenchOptions): Promise<OrdersBenchRow[]> {
  const rounds = opts.rounds ?? 3;
  const dir = mkdtempSync(join(tmpdir(), 'tb-orders-bench-'));
  let broker: ChildProcess | undefined;
  const emulator = await startEmulatorProcess();
  try {
    const credentialsFile = join(dir, 'credentials.json');
    writeFileSync(credentialsFile, JSON.stringify(CREDENTIALS), { mode: 0o600 });
    const port = await freePort();
    broker = fork(join(__dirname, '..', 'main.js'), [], {
      stdio: 'ignore',
      env: {
        PATH: process.env.PATH,
        PORT: String(port),
        HOST: '127.0.0.1',
        PROVIDER_AUTH_URL: emulator.url,
        PROVIDER_BASE_URL: emulator.url,
        CREDENTIALS_FILE: credentialsFile,
        CALLER_AUTH_MODE: 'none',
        CALLER_AUTH_ALLOW_NONE: 'true',
        // The production default: the audit line per order is part of the cost.
        LOG_LEVEL: 'info',
      },
    });
    const brokerUrl = `http://127.0.0.1:${port}`;
    await waitReady(brokerUrl, broker);

    const targets: Array<{ name: string; url: string; unique?: boolean }> = [
      { name: 'direct POST to the emulator', url: `${emulator.url}${PROVIDER_ORDERS_PATHS[0]}` },
      { name: 'broker POST /orders', url: `${brokerUrl}/orders` },
    ];
    if (opts.withIdempotencyKey) {
      targets.push({
        name: 'broker POST /orders + Idempotency-Key',
        url: `${brokerUrl}/orders`,
        unique: true,
      });
    }
    // The emulator checks the bearer token: the direct calls use the broker's own token.
    const token = await brokerToken(brokerUrl);
    const run = (t: (typeof targets)[number], durationSec: number) =>
      load(
        t.url,
        t.unique === true,
        durationSec,
        opts.connections,
        t.url.startsWith(emulator.url) ? token : undefined,
      ).finally(
        // Forget the orders created, so memory use stays flat across rounds.
        () => emulator.reset(),
      );

    for (const t of targets) await run(t, 1); // warm-up: JIT, keep-alive pools
    const samples = targets.map(() => [] as OrdersBenchRow[]);
    for (let r = 0; r < rounds; r++) {
      for (let i = 0; i < targets.length; i++) {
        samples[i].push(await run(targets[i], opts.durationSec));
      }
    }
    return targets.map((t, i) => mean(t.name, samples[i]));
  } finally {
    if (broker && broker.exitCode === null) {
      const exited = new Promise((resolve) => broker!.once('exit', resolve));
      broker.kill('SIGTERM');
      await exited;
    }
    await emulator.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

interface EmulatorProcess {
  url: string;
  /** Clears the emulator's stats (the orders it keeps), resolved once done. */
  reset(): Promise<void>;
  close(): Promise<void>;
}

/** Forks this module as the emulator's process and waits for its URL. */
async function startEmulatorProcess(): Promise<EmulatorProcess> {
  const child = fork(__filename, [EMULATOR_ARG], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const url = await new Promise<string>((resolve, reject) => {
    child.once('message', (m: { url?: string }) =>
      m.url ? resolve(m.url) : reject(new Error('no url')),
    );
    child.once('exit', (code) => reject(new Error(`the emulator process exited with ${code}`)));
  });
  const request = (command: string) =>
    new Promise<void>((resolve) => {
      child.once('message', () => resolve());
      child.send({ command });
    });
  return {
    url,
    reset: () => request('reset'),
    close: async () => {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

/** The forked side: an emulator answering `reset` over IPC. */
async function serveEmulator(): Promise<void> {
  const emulator = await ProviderEmulator.start({
    credentials: { [CREDENTIALS.client_id]: CREDENTIALS.client_secret },
  });
  process.on('message', (m: { command?: string }) => {
    if (m.command === 'reset') emulator.reset();
    process.send!({ done: m.command });
  });
  process.once('SIGTERM', () => void emulator.close().then(() => process.exit(0)));
  process.send!({ url: emulator.url });
}

if (require.main === module && process.argv.includes(EMULATOR_ARG)) {
  void serveEmulator();
}

async function load(
  url: string,
  uniqueKeys: boolean,
  durationSec: number,
  connections: number,
  bearer: string | undefined,
): Promise<OrdersBenchRow> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (bearer) headers.authorization = `Bearer ${bearer}`;
  let n = 0;
  const result = await autocannon({
    url,
    method: 'POST',
    headers,
    body: ORDER,
    connections,
    duration: durationSec,
    ...(uniqueKeys && {
      requests: [
        {
          setupRequest: (req) => ({
            ...req,
            headers: { ...req.headers, 'idempotency-key': `bench-${process.pid}-${n++}` },
          }),
        },
      ],
    }),
  });
  if (result.non2xx > 0 || result.errors > 0 || result.timeouts > 0) {
    throw new Error(
      `${url}: ${result.non2xx} non-2xx answers, ${result.errors} errors and ${result.timeouts} timeouts under load`,
    );
  }
  return {
    name: url,
    reqPerSec: result.requests.average,
    p50Ms: result.latency.p50,
    p99Ms: result.latency.p99,
  };
}

function mean(name: string, rows: OrdersBenchRow[]): OrdersBenchRow {
  const avg = (f: (r: OrdersBenchRow) => number) =>
    rows.reduce((s, r) => s + f(r), 0) / rows.length;
  return {
    name,
    reqPerSec: avg((r) => r.reqPerSec),
    p50Ms: avg((r) => r.p50Ms),
    p99Ms: avg((r) => r.p99Ms),
  };
}

/** The token the broker holds, fetched through its own `GET /token` (caller auth is off). */
async function brokerToken(baseUrl: string): Promise<string> {
  const res = await fetch(`${baseUrl}/token`);
  if (res.status !== 200) throw new Error(`GET /token answered ${res.status}`);
  return ((await res.json()) as { access_token: string }).access_token;
}

async function waitReady(baseUrl: string, child: ChildProcess, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`the broker exited with code ${child.exitCode}`);
    if ((await status(`${baseUrl}/health/ready`).catch(() => 0)) === 200) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`the broker at ${baseUrl} was not ready within ${timeoutMs} ms`);
}

async function status(url: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = get(url, { agent: false, timeout: 1000 }, (res) => {
      res.resume();
      res.once('end', () => resolve(res.statusCode ?? 0));
    });
    req.once('timeout', () => req.destroy(new Error('timeout')));
    req.once('error', reject);
  });
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}
