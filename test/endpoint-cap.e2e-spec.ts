import { type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

// Forty clients, a Redis and two brokers on a shared machine take more than Jest's 5 s to start.
jest.setTimeout(120_000);

const CLIENTS = Array.from({ length: 40 }, (_, i) => `merchant-${i}-prod`);
const RATE = 5;

/**
 * Forty merchants of one authorization server starting at once on two replicas: the fleet sends
 * that token endpoint no more than TOKEN_ENDPOINT_RATE_PER_SECOND requests a second, and still
 * one per client.
 */
describe('the fleet-wide bound on one token endpoint (2 brokers, real Redis)', () => {
  let stack: Stack;

  beforeAll(async () => {
    stack = await startStack({
      name: 'endpoint-cap',
      inProcess: true,
      clients: CLIENTS,
      redis: 'standalone',
      replicas: 2,
      callerAuth: { mode: 'api-key', callers: { shop: { clients: ['*'], scopes: ['token'] } } },
      env: {
        LOG_LEVEL: 'error',
        TOKEN_ENDPOINT_RATE_PER_SECOND: String(RATE),
        TOKEN_ENDPOINT_MAX_CONCURRENCY: '2',
        // A caller may wait for its client's turn.
        TOKEN_WAIT_TIMEOUT_MS: '15000',
      },
    });
  });
  afterAll(async () => {
    await stack?.close();
  });

  it('a cold start of 40 clients sends at most 5 token requests a second, one per client', async () => {
    const served = new Set<string>();
    await waitFor(
      async () => {
        await Promise.all(
          CLIENTS.filter((c) => !served.has(c)).map(async (client, i) => {
            const res = await fetch(`${stack.brokers[i % 2].url}/token?client=${client}`, {
              headers: { authorization: `Bearer ${stack.keys.shop}` },
            });
            if (res.status === 200) served.add(client);
            else await res.body?.cancel();
          }),
        );
        return served.size === CLIENTS.length;
      },
      { timeoutMs: 60_000, what: 'every client to be served' },
    );
    const times = [...stack.provider.stats.tokenRequestTimes].sort((a, b) => a - b);
    // The busiest second, as the provider saw it (one clock: this machine's).
    let busiest = 0;
    for (let i = 0, j = 0; j < times.length; j++) {
      while (times[j] - times[i] >= 1000) i++;
      busiest = Math.max(busiest, j - i + 1);
    }
    console.log(
      `endpoint cap ${RATE}/s: ${times.length} token requests for ${CLIENTS.length} clients over ${times[times.length - 1] - times[0]} ms; busiest second ${busiest}`,
    );
    expect(times).toHaveLength(CLIENTS.length);
    expect(busiest).toBeLessThanOrEqual(RATE);
  });
});

/** The sum of a counter's series with `label`, from a Prometheus text body. */
function counter(body: string, name: string, label: string): number {
  let sum = 0;
  for (const line of body.split('\n')) {
    if (line.startsWith(`${name}{`) && line.includes(label)) sum += Number(line.split(' ').pop());
  }
  return sum;
}

/**
 * The same cold start, slower (4 a second: 10 s for all), with one broker: the clients that wait
 * their turn wait in the broker's memory, not in a loop of Redis round trips, and a caller's
 * client is fetched before those nobody asked for.
 */
describe('clients waiting for the endpoint (1 broker, real Redis)', () => {
  let stack: Stack;

  beforeAll(async () => {
    stack = await startStack({
      name: 'endpoint-queue',
      inProcess: true,
      admin: true,
      clients: CLIENTS,
      redis: 'standalone',
      replicas: 1,
      callerAuth: { mode: 'api-key', callers: { shop: { clients: ['*'], scopes: ['token'] } } },
      env: {
        LOG_LEVEL: 'error',
        TOKEN_ENDPOINT_RATE_PER_SECOND: '4',
        TOKEN_ENDPOINT_MAX_CONCURRENCY: '2',
        TOKEN_WAIT_TIMEOUT_MS: '15000',
      },
    });
  });
  afterAll(async () => {
    await stack?.close();
  });

  it("serves a caller's client ahead of the queue, and takes each client's lock about once", async () => {
    const [broker] = stack.brokers;
    const last = CLIENTS[CLIENTS.length - 1];
    const asked = Date.now();
    const res = await fetch(`${broker.url}/token?client=${last}`, {
      headers: { authorization: `Bearer ${stack.keys.shop}` },
    });
    const waitedMs = Date.now() - asked;
    expect(res.status).toBe(200);
    const fetchedBefore = stack.provider.stats.tokenRequests;
    console.log(
      `endpoint queue: the last client served ${waitedMs} ms after its caller asked, ${fetchedBefore} of ${CLIENTS.length} fetched by then`,
    );
    // In start-up order it would come last, some 10 s in.
    expect(fetchedBefore).toBeLessThan(CLIENTS.length / 2);

    await waitFor(async () => stack.provider.stats.tokenRequests >= CLIENTS.length, {
      timeoutMs: 60_000,
      what: 'every client to be fetched',
    });
    const metrics = await (await fetch(`${broker.adminUrl!}/metrics`)).text();
    const locks = counter(metrics, 'token_broker_lock_attempts_total', 'result="acquired"');
    const capped = counter(metrics, 'token_broker_refresh_total', 'result="endpoint_capped"');
    console.log(
      `endpoint queue: ${locks} lock acquisitions, ${capped} passes turned away by the cap`,
    );
    // Passes wait their turn at the broker's gate (2 inside at once): only those inside ask Redis
    // again. Without the gate, forty clients would poll the cap every ~150 ms for 10 s: some 2,500.
    expect(locks).toBeLessThan(CLIENTS.length * 4);
    expect(stack.provider.stats.tokenRequests).toBe(CLIENTS.length);
  });
});
