import { type Stack, startStack } from './support/stack';
import { metricValue } from './support/token-watch';

// A Redis and a broker on a shared machine take more than Jest's 5 s to start.
jest.setTimeout(60_000);

const GOOD = 'acme-prod';
const BROKEN = 'initech-prod';

interface Readiness {
  status: string;
  info?: { tokens?: { clients: { client: string; servable: boolean }[]; unservable?: string[] } };
  error?: { tokens?: { clients: { client: string; servable: boolean }[]; unservable?: string[] } };
}

async function ready(url: string): Promise<{ status: number; body: Readiness }> {
  const res = await fetch(`${url}/health/ready`);
  return { status: res.status, body: (await res.json()) as Readiness };
}

/**
 * Two merchants on one broker, one of whose credentials the provider refuses: that merchant's
 * failure is its own. The pod stays in rotation for the other, and the broken one is named.
 */
describe('one broken client of two (real Redis, admin listener)', () => {
  let stack: Stack;

  beforeAll(async () => {
    stack = await startStack({
      name: 'isolation',
      inProcess: true,
      clients: [GOOD, { id: BROKEN, refused: true }],
      redis: 'standalone',
      admin: true,
      callerAuth: {
        mode: 'api-key',
        callers: { shop: { clients: ['*'], scopes: ['token'] } },
      },
      env: { LOG_LEVEL: 'fatal' },
    });
  });
  afterAll(async () => {
    await stack?.close();
  });

  it('answers ready on both ports and names the broken client in the admin details, a metric and GET /token', async () => {
    const broker = stack.broker;
    const callers = await ready(broker.url);
    expect(callers).toEqual({ status: 200, body: { status: 'ok' } });
    const admin = await ready(broker.adminUrl!);
    expect(admin.status).toBe(200);
    expect(admin.body.info?.tokens?.unservable).toEqual([BROKEN]);
    expect(admin.body.info?.tokens?.clients).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ client: GOOD, servable: true }),
        expect.objectContaining({ client: BROKEN, servable: false }),
      ]),
    );
    // A series of its own only for the client that cannot be served.
    const unservable = (client: string) =>
      metricValue(broker.adminUrl!, 'token_broker_client_unservable', { client });
    expect(await unservable(GOOD)).toBe(0);
    expect(await unservable(BROKEN)).toBe(1);
    const good = await fetch(`${broker.url}/token?client=${GOOD}`, {
      headers: { authorization: `Bearer ${stack.keys.shop}` },
    });
    expect(good.status).toBe(200);
    const broken = await fetch(`${broker.url}/token?client=${BROKEN}`, {
      headers: { authorization: `Bearer ${stack.keys.shop}` },
    });
    expect(broken.status).toBe(503);
  });

  it('is not ready when readiness.requiredClients names the broken client', async () => {
    const strict = await stack.addBroker({
      env: { READINESS_REQUIRED_CLIENTS: `${GOOD},${BROKEN}` },
    });
    const answer = await ready(strict.adminUrl!);
    expect(answer.status).toBe(503);
    expect(answer.body.error?.tokens?.unservable).toEqual([BROKEN]);
    const lenient = await stack.addBroker({ env: { READINESS_REQUIRED_CLIENTS: GOOD } });
    expect((await ready(lenient.url)).status).toBe(200);
  });
});
