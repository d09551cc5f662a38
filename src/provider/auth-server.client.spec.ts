import type { Server } from 'node:http';
import { testClient } from '../../test/support/test-config';
import { providerSettingsSchema } from '../config/provider.schema';
import { AuthServerClient } from './auth-server.client';
import { ProviderErrorCode } from './provider.exception';
import { createProviderAgent } from './provider-http';
import type { Agent } from 'undici';
import { serveLoopback as serve } from '../../test/support/loopback-server';

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
  const client = (url: string) => testClient({ authUrl: url, baseUrl: url });

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
