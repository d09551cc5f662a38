/**
 * @timed: it times brokers under load; only another @timed suite runs beside it (scripts/test.mjs).
 */
// The package's source, not `@token-broker/client`: node_modules may link another checkout's.
import {
  type BrokerClient,
  BrokerUnavailableError,
  createBrokerClient,
} from '../packages/client/src';
import { FLEET_CLIENT } from './support/fleet';
import { newKey, type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

/** Short provider tokens so an outage outlives one within the test. */
const LIFETIME_S = 10;

/** The value below which `p` of `values` lie. */
function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0;
}

interface Call {
  at: number;
  ms: number;
  token?: string;
  error?: unknown;
}

/**
 * `@token-broker/client` against real broker processes (a two-broker fleet on Redis, caller
 * auth mode `api-key`; processes, because one is killed): a caller calling `getToken` every 50 ms sees no failure while a valid
 * token exists, through a restart of the broker it talks to and through a provider outage.
 */
jest.setTimeout(120_000);

describe('@token-broker/client against real brokers', () => {
  const apiKey = newKey();
  let fleet: Stack;
  let client: BrokerClient;

  beforeAll(async () => {
    fleet = await startStack({
      name: 'node-client',
      clients: [FLEET_CLIENT],
      redis: 'standalone',
      replicas: 2,
      callerAuth: {
        mode: 'api-key',
        callers: { checkout: { clients: [FLEET_CLIENT], key: apiKey } },
      },
      knobs: { tokenLifetimeSeconds: LIFETIME_S },
      // The outage's retries back off up to 2 s, not the default 30: the next token follows the
      // provider's return within seconds, and the suite does not wait out a long backoff.
      env: { LOG_LEVEL: 'warn', TOKEN_BACKOFF_MAX_MS: '2000' },
    });
    client = createBrokerClient({ baseUrl: fleet.brokers[0].url, apiKey });
  });

  afterAll(async () => {
    await fleet?.close();
  });

  /** Calls `getToken` every 50 ms until `until` resolves; records every answer. */
  async function callWhile(until: Promise<unknown>): Promise<Call[]> {
    const calls: Call[] = [];
    let done = false;
    void until.finally(() => (done = true));
    while (!done) {
      const at = Date.now();
      try {
        const token = await client.getToken({ client: FLEET_CLIENT });
        calls.push({ at, ms: Date.now() - at, token: token.accessToken });
      } catch (error) {
        calls.push({ at, ms: Date.now() - at, error });
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    await until;
    return calls;
  }

  const expiryOf = (token: string) =>
    fleet.provider.stats.issued.find((t) => t.token === token)!.expiresAt;

  it('a broker restart: every call answered with a valid token, from cache while it is down', async () => {
    await client.getToken({ client: FLEET_CLIENT });
    const broker = fleet.brokers[0];
    const restart = (async () => {
      await new Promise((r) => setTimeout(r, 500));
      await broker.process!.kill('SIGKILL');
      const downAt = Date.now();
      // Down for two seconds, then the same port again.
      await new Promise((r) => setTimeout(r, 2000));
      await fleet.addBroker({ name: 'broker-0-restarted', env: { PORT: String(broker.port) } });
      await new Promise((r) => setTimeout(r, 1000));
      return downAt;
    })();
    const calls = await callWhile(restart);
    const failed = calls.filter((c) => c.error);
    expect(failed).toEqual([]);
    for (const c of calls) expect(expiryOf(c.token!)).toBeGreaterThan(c.at);
    // Served from the client's cache, never waiting on the dead broker.
    expect(calls.length).toBeGreaterThan(50);
    const ms = calls.map((c) => c.ms);
    console.log(
      `getToken during a broker restart: ${calls.length} calls, p50 ${percentile(ms, 0.5)} ms, p99 ${percentile(ms, 0.99)} ms, max ${Math.max(...ms)} ms`,
    );
    // Far below a request timeout (5 s) or a retry's backoff: nobody waited on the dead broker
    // (the margin absorbs event-loop stalls of a busy test machine).
    expect(percentile(ms, 0.99)).toBeLessThan(500);
  });

  it('a provider outage: no failed call while a valid token exists, then the next token', async () => {
    // Start right after a fresh token, so the outage spans the fleet's refresh and the expiry.
    const issued = fleet.provider.stats.tokensIssued;
    await waitFor(() => fleet.provider.stats.tokensIssued > issued || undefined, {
      timeoutMs: LIFETIME_S * 1000,
      what: 'the fleet to refresh its token',
    });
    const last = fleet.provider.stats.issued.at(-1)!;
    fleet.provider.setKnobs({ tokenFailure: { kind: 'status', status: 503 } });
    const outage = (async () => {
      // Past the last token's expiry, then restored until a call gets the next token.
      await new Promise((r) => setTimeout(r, last.expiresAt - Date.now() + 2000));
      fleet.provider.setKnobs({ tokenFailure: null });
      await waitFor(
        async () => {
          const t = await client.getToken({ client: FLEET_CLIENT }).catch(() => undefined);
          return (t && t.accessToken !== last.token) || undefined;
        },
        { timeoutMs: 30_000, what: 'the next token after the outage' },
      );
    })();
    const calls = await callWhile(outage);
    const beforeExpiry = calls.filter((c) => c.at < last.expiresAt - 1500);
    expect(beforeExpiry.length).toBeGreaterThan(20);
    // While the last token was valid: no call failed, each answered with a valid token (the
    // one before it from the client's cache at first, then the last one).
    expect(beforeExpiry.filter((c) => c.error)).toEqual([]);
    expect(beforeExpiry.at(-1)!.token).toBe(last.token);
    // After its expiry nothing valid exists: the failures are typed, retryable, and only then.
    const failed = calls.filter((c) => c.error);
    for (const f of failed) {
      expect(f.error).toBeInstanceOf(BrokerUnavailableError);
      expect(f.at).toBeGreaterThanOrEqual(last.expiresAt - 1500);
    }
    for (const c of calls.filter((c) => c.token)) expect(expiryOf(c.token!)).toBeGreaterThan(c.at);
    // And the fleet's next token once the provider is back.
    const after = await client.getToken({ client: FLEET_CLIENT });
    expect(after.accessToken).not.toBe(last.token);
    expect(fleet.provider.isValidToken(after.accessToken)).toBe(true);
  });

  it('orders.create: one order per Idempotency-Key, the same key on a repeat', async () => {
    const key = `order-${newKey()}`;
    const first = await client.orders.create(
      { amount: 1999, currency: 'EUR' },
      { client: FLEET_CLIENT, idempotencyKey: key },
    );
    const again = await client.orders.create(
      { amount: 1999, currency: 'EUR' },
      { client: FLEET_CLIENT, idempotencyKey: key },
    );
    expect(first).toMatchObject({ status: 201, idempotencyKey: key, replayed: false });
    expect(again).toMatchObject({ status: 201, idempotencyKey: key, replayed: true });
    expect(again.body).toEqual(first.body);
    const generated = await client.orders.create({ amount: 5 }, { client: FLEET_CLIENT });
    expect(generated.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
    const seen = fleet.provider.stats.orders.map((o) => o.idempotencyKey);
    expect(seen.filter((k) => k === key)).toHaveLength(1);
  });
});
