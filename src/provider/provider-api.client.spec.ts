import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Readable } from 'node:stream';
import { testClient } from '../../test/support/test-config';
import { ordersSettingsSchema } from '../config/provider.schema';
import { type ApiOutcome, createCheckoutAgent, ProviderApiClient } from './provider-api.client';
import { ProviderErrorCode } from './provider.exception';
import type { Agent } from 'undici';
import { serveLoopback as serve } from '../../test/support/loopback-server';

/** Answers 200, then a byte every 100 ms for 2 s: never idle long enough for undici's timers. */
function drip(contentLength?: number) {
  return (req: IncomingMessage, res: ServerResponse): void => {
    res.writeHead(200, {
      'content-type': 'application/json',
      ...(contentLength !== undefined && { 'content-length': String(contentLength) }),
    });
    let left = 20;
    const timer = setInterval(() => {
      if (--left > 0) res.write(' ');
      else {
        clearInterval(timer);
        res.end();
      }
    }, 100);
    req.socket.once('close', () => clearInterval(timer));
  };
}

/** The passthrough adapter against real HTTP servers on loopback. */
describe(ProviderApiClient.name, () => {
  // 100 + 200 + 200 ms: the whole call's deadline is 500 ms.
  const settings = ordersSettingsSchema.parse({
    connectTimeoutMs: 100,
    headersTimeoutMs: 200,
    bodyTimeoutMs: 200,
  });
  const deadlineMs = 500;
  const servers: Server[] = [];
  let agent: Agent;
  let api: ProviderApiClient;

  beforeEach(() => {
    agent = createCheckoutAgent(settings);
    api = new ProviderApiClient(agent, settings);
  });
  afterEach(async () => {
    await agent.destroy();
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
  const call = (url: string, method = 'GET'): Promise<ApiOutcome> =>
    api.call({
      client: testClient({ id: 'a', authUrl: url, baseUrl: url }),
      accessToken: 'provider-token',
      method,
      target: '/api/marketing/v1/offers',
      headers: {},
      maxResponseBytes: 1024 * 1024,
      limitSetting: 'FORWARD_MAX_RESPONSE_BYTES',
    });

  it('ends a small answer that drips at its one deadline: timeout, maybe delivered', async () => {
    const provider = await serve(drip(20));
    servers.push(provider.server);
    const started = performance.now();
    const outcome = await call(provider.url);
    expect(performance.now() - started).toBeLessThan(deadlineMs + 400);
    expect(outcome).toMatchObject({
      kind: 'failed',
      delivered: 'maybe',
      error: { code: ProviderErrorCode.Timeout },
    });
  });

  it('ends a streamed answer that drips at its one deadline: the body stream fails', async () => {
    const provider = await serve(drip());
    servers.push(provider.server);
    const started = performance.now();
    const outcome = await call(provider.url);
    expect(outcome).toMatchObject({ kind: 'answered', status: 200 });
    const body = (outcome as { body: Readable }).body;
    const read = async () => {
      for await (const chunk of body) void chunk;
    };
    await expect(read()).rejects.toMatchObject({ name: 'TimeoutError' });
    expect(performance.now() - started).toBeLessThan(deadlineMs + 400);
  });

  it('relays a redirect, never follows it: the other server receives nothing', async () => {
    const elsewhere = await serve((_req, res) => res.end('{}'));
    const provider = await serve((_req, res) => {
      res.writeHead(307, { location: `${elsewhere.url}/api/marketing/v1/offers` });
      res.end();
    });
    servers.push(elsewhere.server, provider.server);
    const outcome = await call(provider.url, 'POST');
    expect(outcome).toMatchObject({ kind: 'answered', status: 307 });
    expect(provider.seen()).toBe(1);
    expect(elsewhere.seen()).toBe(0);
  });
});
