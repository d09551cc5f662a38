import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A plain HTTP server on loopback for an adapter spec, with a count of the requests it saw. */
export interface LoopbackServer {
  readonly server: Server;
  readonly url: string;
  seen(): number;
}

/** Starts a loopback server answering with `handle`, on a free port. */
export async function serveLoopback(
  handle: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<LoopbackServer> {
  let seen = 0;
  const server = createServer((req, res) => {
    seen++;
    handle(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { server, url, seen: () => seen };
}
