import type { Server } from 'node:http';
import { CallerAuthErrorCode } from './caller-auth.exception';
import { remoteServiceAccountKeys } from './service-account-keys';
import { serveLoopback as serve } from '../../test/support/loopback-server';

/** The JWKS fetch against real HTTP servers on loopback. */
describe(remoteServiceAccountKeys.name, () => {
  const servers: Server[] = [];
  afterEach(async () => {
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('ends a JWKS answer that drips a byte every 100 ms at the fetch deadline', async () => {
    const jwks = await serve((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"keys":[');
      let left = 20; // 2 s of spaces, then the end
      const drip = setInterval(() => {
        if (--left > 0) res.write(' ');
        else {
          clearInterval(drip);
          res.end(']}');
        }
      }, 100);
      req.socket.once('close', () => clearInterval(drip));
    });
    servers.push(jwks.server);
    const started = performance.now();
    const keys = remoteServiceAccountKeys(`${jwks.url}/openid/v1/jwks`, { timeoutMs: 300 });
    await expect(keys.warmUp()).rejects.toMatchObject({ code: CallerAuthErrorCode.Unavailable });
    expect(performance.now() - started).toBeLessThan(300 + 400);
  });

  it('never follows a redirect: the other server receives nothing', async () => {
    const elsewhere = await serve((_req, res) => res.end('{"keys":[]}'));
    const jwks = await serve((_req, res) => {
      res.writeHead(307, { location: `${elsewhere.url}/openid/v1/jwks` });
      res.end();
    });
    servers.push(elsewhere.server, jwks.server);
    const keys = remoteServiceAccountKeys(`${jwks.url}/openid/v1/jwks`, { timeoutMs: 300 });
    await expect(keys.warmUp()).rejects.toMatchObject({ code: CallerAuthErrorCode.Unavailable });
    expect(jwks.seen()).toBe(1);
    expect(elsewhere.seen()).toBe(0);
  });
});
