import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { clientSchema, providerSettingsSchema } from '../config/config.schema';
import { AuthServerClient } from './auth-server.client';
import { ProviderErrorCode } from './provider.exception';
import { createProviderAgent } from './provider-http';
import type { Agent } from './undici-agent';

/** Starts a loopback server answering with `handle`; its URL and a count of requests seen. */
async function serve(
  handle: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<{ server: Server; url: string; seen: () => number }> {
  let seen = 0;
  const server = createServer((req, res) => {
    seen++;
    handle(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { server, url, seen: () => seen };
}

/** The token endpoint adapter against real HTTP servers on loopback. */
describe(AuthServerClient.name, () => {
  // 100 + 400 ms: the whole call's deadline is 500 ms.
  const settings = providerSettingsSchema.parse({ connectTimeoutMs: 100, responseTimeoutMs: 400 });
  const deadlineMs = 500;
  const credentials = { clientId: 'id', clientSecret: 'secret' };
  const servers: Server[] = [];
  let agent: Agent;
  let grantor: AuthServerClient;

  beforeEach(() => {
    agent = createProviderAgent(settings);
    grantor = new AuthServerClient(agent, settings, 1800);
  });
  afterEach(async () => {
    await agent.destroy();
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
  const client = (url: string) =>
    clientSchema.parse({ id: 'acme', authUrl: url, baseUrl: url, credentials: { file: '/a' } });

  it('ends a token answer that drips a byte every 100 ms at its one deadline: timeout', async () => {
    const provider = await serve((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"access_token":"t"');
      let left = 20; // 2 s of spaces, then the end: the idle timers alone let it all through.
      const drip = setInterval(() => {
        if (--left > 0) res.write(' ');
        else {
          clearInterval(drip);
          res.end(',"expires_in":1800}');
        }
      }, 100);
      req.socket.once('close', () => clearInterval(drip));
    });
    servers.push(provider.server);
    const started = performance.now();
    const err = await grantor
      .requestToken(client(provider.url), credentials)
      .catch((e: unknown) => e);
    expect(performance.now() - started).toBeLessThan(deadlineMs + 400);
    expect(err).toMatchObject({ code: ProviderErrorCode.Timeout });
  });

  it('never follows a redirect: the other server receives nothing', async () => {
    const elsewhere = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"access_token":"elsewhere","expires_in":1800}');
    });
    const provider = await serve((_req, res) => {
      res.writeHead(307, { location: `${elsewhere.url}/api/auth/v1/oauth/token` });
      res.end();
    });
    servers.push(elsewhere.server, provider.server);
    const err = await grantor
      .requestToken(client(provider.url), credentials)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: ProviderErrorCode.Rejected, details: { status: 307 } });
    expect(provider.seen()).toBe(1);
    expect(elsewhere.seen()).toBe(0);
  });
});
