import { type ChildProcess, fork } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from 'undici';
import {
  PROVIDER_ORDERS_PATHS,
  ProviderEmulator,
  type ProviderKnobs,
} from '../emulator/provider-emulator';
import type { BrokerProcess } from '../test/support/broker-process';
import { adoptChild } from '../test/support/managed-process';
import { freePort } from '../test/support/ports';
import { loadWithLatency } from './latency';
import { spawnImageBroker } from './paths';

/** One measured configuration, as the main bench harness prints it. */
export interface OrdersBenchRow {
  name: string;
  reqPerSec: number;
  p50Ms: number;
  p99Ms: number;
}

/** Per-request latency of one caller sending orders one after another, in microseconds. */
export interface SequentialLatency {
  name: string;
  requests: number;
  p50Us: number;
  p99Us: number;
}

/** Everything {@link benchOrders} measured, for the harness to print. */
export interface OrdersBenchReport {
  /** Emulator answering at once: direct, the bare forwarder, the broker (CPU-bound). */
  instant: OrdersBenchRow[];
  /** Emulator taking {@link OrdersBenchOptions.providerLatencyMs} per order: direct, the bare forwarder, the broker. */
  delayed: OrdersBenchRow[];
  /** One connection, one order at a time, emulator answering at once: direct, broker. */
  sequential: SequentialLatency[];
  /**
   * A forwarded GET (`/provider/<client>/api/marketing/v1/offers?amount=500`), emulator answering
   * at once: direct, the bare forwarder, the broker's passthrough (rate limits on, in memory).
   */
  forwarded: OrdersBenchRow[];
}

/** Options of {@link benchOrders}. */
export interface OrdersBenchOptions {
  /** Length of each measured run. */
  durationSec: number;
  /** Concurrent connections autocannon keeps open (same for every target). */
  connections: number;
  /**
   * Interleaved rounds (direct, broker, direct, broker...) averaged into one row per target,
   * so drift on a shared machine hits both alike.
   * @default 3
   */
  rounds?: number;
  /**
   * Also measure the broker with a unique `Idempotency-Key` per request (in-memory store), as
   * another row of the instant section.
   * @default false
   */
  withIdempotencyKey?: boolean;
  /**
   * The emulator's time per order in the `delayed` section, standing in for a real provider
   * across a network.
   * @default 5
   */
  providerLatencyMs?: number;
  /**
   * Orders sent one at a time per target in the `sequential` section.
   * @default 3000
   */
  sequentialRequests?: number;
}

const CREDENTIALS = { client_id: 'bench-merchant', client_secret: 'bench-secret-value' };

/** A create-order body shaped like the provider's own storefront plugin's, about 600 bytes. */
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

/** A marketing API path the emulator echoes (the passthrough's default allow-list covers it). */
const MARKETING_OFFERS = '/api/marketing/v1/offers';

/** Argument that makes this module, forked, run the emulator instead of a benchmark. */
const EMULATOR_ARG = '--orders-bench-emulator';

/**
 * `POST /orders` through one broker process (in-memory stores, no Redis) against the same POST
 * made directly to the provider emulator, same autocannon settings, interleaved, in three
 * settings:
 * - `instant`: the emulator answers at once, so every process is CPU-bound and three of them
 *   (load generator, broker, emulator) share the machine's cores where the direct call has two.
 *   The bare forwarder (`bench/bare-forwarder.ts`) is measured beside them as the floor of any
 *   Node process in the path.
 * - `delayed`: the emulator takes `providerLatencyMs` per order, as a real provider across a
 *   network does; what the broker adds is then seen against a realistic call.
 * - `sequential`: one caller, one order at a time, timed in microseconds: the latency the
 *   broker adds to each order when it is not saturated.
 *
 * The emulator runs in a process of its own, like a real provider: were it in the load
 * generator's process, direct calls would never wait for another process to be scheduled
 * while brokered ones would, and the comparison would measure the operating system.
 *
 * Build first (`npm run bench` does): this module starts the production bundle, `dist/main.js`.
 */
export async function benchOrders(opts: OrdersBenchOptions): Promise<OrdersBenchReport> {
  const rounds = opts.rounds ?? 3;
  let broker: BrokerProcess | undefined;
  let forwarder: ChildProcess | undefined;
  let getForwarder: ChildProcess | undefined;
  const emulator = await startEmulatorProcess();
  // The credentials file's folder goes with the emulator's process, also if the bench is killed.
  const dir = mkdtempSync(join(tmpdir(), 'tb-orders-bench-'));
  adoptChild(emulator.child, dir);
  try {
    const credentialsFile = join(dir, 'credentials.json');
    writeFileSync(credentialsFile, JSON.stringify(CREDENTIALS), { mode: 0o600 });
    broker = await spawnImageBroker({
      name: 'broker (orders)',
      // To a file, as a container runtime's log driver takes it: read through a pipe here, the
      // audit lines would cost the load generator's CPU.
      outputToFile: true,
      env: {
        HOST: '127.0.0.1',
        PROVIDER_AUTH_URL: emulator.url,
        PROVIDER_BASE_URL: emulator.url,
        CREDENTIALS_FILE: credentialsFile,
        // Mode none needs a development NODE_ENV (unset is production).
        NODE_ENV: 'development',
        CALLER_AUTH_MODE: 'none',
        CALLER_AUTH_ALLOW_NONE: 'true',
        // The production default: the audit line per order is part of the cost.
        LOG_LEVEL: 'info',
        // The rate limits stay on (the limiter's cost is measured) but out of reach.
        FORWARD_CLIENT_RATE_PER_SECOND: '100000',
        FORWARD_CALLER_RATE_PER_SECOND: '100000',
        ORDERS_CLIENT_RATE_PER_SECOND: '100000',
        ORDERS_CALLER_RATE_PER_SECOND: '100000',
      },
    });
    await broker.waitReady();
    const brokerUrl = broker.url;
    // The emulator checks the bearer token: direct calls use the broker's own token.
    const token = await brokerToken(brokerUrl);
    const ordersUrl = `${emulator.url}${PROVIDER_ORDERS_PATHS[0]}`;
    const forwarderPort = await freePort();
    forwarder = await startForwarder(forwarderPort, ordersUrl, token);

    const direct: Target = { name: 'direct POST to the emulator', url: ordersUrl, bearer: token };
    const viaBroker: Target = { name: 'broker POST /orders', url: `${brokerUrl}/orders` };
    const floor: Target = {
      name: 'bare forwarder (node:http + undici)',
      url: `http://127.0.0.1:${forwarderPort}/orders`,
    };
    const measure = async (targets: Target[]): Promise<OrdersBenchRow[]> => {
      const run = (t: Target, durationSec: number) =>
        load(t, durationSec, opts.connections).finally(
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
    };

    // The passthrough: a GET of the marketing API (the emulator echoes it).
    const offers = `${MARKETING_OFFERS}?amount=500`;
    const getForwarderPort = await freePort();
    getForwarder = await startForwarder(getForwarderPort, `${emulator.url}${offers}`, token);
    const forwarded = await measure([
      {
        name: 'direct GET to the emulator',
        url: `${emulator.url}${offers}`,
        bearer: token,
        method: 'GET',
      },
      {
        name: 'bare forwarder GET',
        url: `http://127.0.0.1:${getForwarderPort}${offers}`,
        method: 'GET',
      },
      {
        name: 'broker GET /provider/default/...',
        url: `${brokerUrl}/provider/default${offers}`,
        method: 'GET',
      },
    ]);

    const instant = await measure([
      direct,
      floor,
      viaBroker,
      ...(opts.withIdempotencyKey
        ? [{ ...viaBroker, name: 'broker POST /orders + Idempotency-Key', uniqueKeys: true }]
        : []),
    ]);
    // The bare forwarder too: any process in the path adds a hop (two loopback round trips and
    // a wake-up), which is not the broker's own cost.
    const sequential = await sequentialLatency(
      [direct, floor, viaBroker],
      opts.sequentialRequests ?? 3000,
      () => emulator.reset(),
    );
    const latencyMs = opts.providerLatencyMs ?? 5;
    await emulator.setKnobs({ ordersLatencyMs: latencyMs });
    const delayed = await measure([
      { ...direct, name: `direct, emulator taking ${latencyMs} ms` },
      { ...floor, name: `bare forwarder, emulator taking ${latencyMs} ms` },
      { ...viaBroker, name: `broker, emulator taking ${latencyMs} ms` },
    ]);
    return { instant, delayed, sequential, forwarded };
  } finally {
    await broker?.stop();
    for (const child of [forwarder, getForwarder]) {
      if (child && child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGTERM');
        await exited;
      }
    }
    // Its exit removes `dir` (adoptChild).
    await emulator.close();
  }
}

interface Target {
  name: string;
  url: string;
  /** The provider token, for calls straight to the emulator. */
  bearer?: string;
  /** A new `Idempotency-Key` on every request. */
  uniqueKeys?: boolean;
  /** `GET` (no body) instead of the order's `POST`. */
  method?: 'GET';
}

/** Forks the bare forwarder (`dist-dev/bench/bare-forwarder.js`) and waits until it listens. */
async function startForwarder(port: number, target: string, token: string): Promise<ChildProcess> {
  const script = join(__dirname, 'bare-forwarder.js');
  const child = fork(script, [String(port), target, token], { stdio: 'ignore' });
  adoptChild(child);
  await new Promise<void>((resolve, reject) => {
    child.once('message', () => resolve());
    child.once('exit', (code) => reject(new Error(`the bare forwarder exited with ${code}`)));
  });
  return child;
}

/**
 * Each target in turn, `requests` orders one after another on one keep-alive connection,
 * interleaved in ten slices so drift hits all targets alike; microsecond timings.
 */
async function sequentialLatency(
  targets: Target[],
  requests: number,
  reset: () => Promise<void>,
): Promise<SequentialLatency[]> {
  const urls = targets.map((t) => new URL(t.url));
  const clients = urls.map((u) => new Client(u.origin, { pipelining: 1 }));
  const timings = targets.map(() => [] as number[]);
  const one = async (i: number, record: boolean) => {
    const t = targets[i];
    const started = process.hrtime.bigint();
    const res = await clients[i].request({
      path: urls[i].pathname,
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(t.bearer !== undefined && { authorization: `Bearer ${t.bearer}` }),
      },
      body: ORDER,
    });
    await res.body.dump();
    if (res.statusCode >= 300) throw new Error(`${t.url}: HTTP ${res.statusCode}`);
    if (record) timings[i].push(Number(process.hrtime.bigint() - started) / 1000);
  };
  try {
    for (let i = 0; i < targets.length; i++) for (let n = 0; n < 200; n++) await one(i, false);
    const slices = 10;
    for (let s = 0; s < slices; s++) {
      for (let i = 0; i < targets.length; i++) {
        for (let n = 0; n < Math.ceil(requests / slices); n++) await one(i, true);
      }
      await reset();
    }
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
  return targets.map((t, i) => {
    const sorted = timings[i].sort((x, y) => x - y);
    const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
    return { name: t.name, requests: sorted.length, p50Us: at(0.5), p99Us: at(0.99) };
  });
}

interface EmulatorProcess {
  child: ChildProcess;
  url: string;
  /** Clears the emulator's stats (the orders it keeps), resolved once done. */
  reset(): Promise<void>;
  /** Sets knobs that stay in force across resets. */
  setKnobs(knobs: Partial<ProviderKnobs>): Promise<void>;
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
  const request = (message: EmulatorCommand) =>
    new Promise<void>((resolve) => {
      child.once('message', () => resolve());
      child.send(message);
    });
  return {
    child,
    url,
    reset: () => request({ command: 'reset' }),
    setKnobs: (knobs) => request({ command: 'knobs', knobs }),
    close: async () => {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

type EmulatorCommand = { command: 'reset' } | { command: 'knobs'; knobs: Partial<ProviderKnobs> };

/** The forked side: an emulator answering `reset` and `knobs` over IPC. */
async function serveEmulator(): Promise<void> {
  const emulator = await ProviderEmulator.start({
    credentials: { [CREDENTIALS.client_id]: CREDENTIALS.client_secret },
  });
  // A reset puts the knobs back to their defaults: the bench's own are applied again.
  let knobs: Partial<ProviderKnobs> = {};
  process.on('message', (m: EmulatorCommand) => {
    if (m.command === 'knobs') knobs = m.knobs;
    else emulator.reset();
    emulator.setKnobs(knobs);
    process.send!({ done: m.command });
  });
  process.once('SIGTERM', () => void emulator.close().then(() => process.exit(0)));
  process.send!({ url: emulator.url });
}

if (require.main === module && process.argv.includes(EMULATOR_ARG)) {
  void serveEmulator();
}

async function load(t: Target, durationSec: number, connections: number): Promise<OrdersBenchRow> {
  const get = t.method === 'GET';
  const headers: Record<string, string> = get ? {} : { 'content-type': 'application/json' };
  if (t.bearer !== undefined) headers.authorization = `Bearer ${t.bearer}`;
  const url = t.url;
  let n = 0;
  const { result, latency } = await loadWithLatency({
    url,
    method: get ? 'GET' : 'POST',
    headers,
    ...(!get && { body: ORDER }),
    connections,
    duration: durationSec,
    ...(t.uniqueKeys === true && {
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
    ...latency,
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
