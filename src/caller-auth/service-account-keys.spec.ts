import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { CallerAuthErrorCode } from './caller-auth.exception';
import { remoteServiceAccountKeys } from './service-account-keys';

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
