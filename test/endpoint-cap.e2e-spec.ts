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
