import { createServer } from 'node:net';

/**
 * Returns a TCP port that was free on 127.0.0.1 a moment ago.
 *
 * The kernel picks the port (listen on port 0), so parallel test files do not collide the way
 * they would with hard-coded or random ports. There is still a short window between closing
 * our listener and the caller binding the port; callers that can retry on `EADDRINUSE`
 * (as `startRedis` does) should.
 */
export async function freePort(): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    server.listen({ port: 0, host: '127.0.0.1', exclusive: true }, () => {
      const address = server.address();
      if (address === null || typeof address === 'string') {
        server.close();
        reject(new Error(`unexpected listen address ${String(address)}`));
        return;
      }
      server.close((err) => (err ? reject(err) : resolve(address.port)));
    });
  });
}
