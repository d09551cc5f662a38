import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/** Below the kernel's ephemeral range, so no outgoing connection is ever given one of these. */
const LOWEST = 10_000;
/** Jest workers (and the runner itself, 0) each draw from their own slice of the range. */
const SLICES = 16;

/**
 * Returns a TCP port that was free on 127.0.0.1 a moment ago, for a server a test is about to
 * start (a spawned broker binds it some 300 ms later).
 *
 * Ports come from below the kernel's ephemeral range (`ip_local_port_range`), from a slice of
 * their own per Jest worker: a port the kernel picked could be handed to another process's
 * outgoing connection in that window, and a port of another worker's slice to its next server.
 * Each candidate is checked with an exclusive listen; where there is no such range (another OS,
 * or an ephemeral range starting low), the kernel picks, and callers that can retry on
 * `EADDRINUSE` (as `startRedis` does) should.
 */
export async function freePort(): Promise<number> {
  for (let tried = 0; slice !== undefined && tried < slice.size; tried++) {
    const port = slice.first + (slice.next++ % slice.size);
    if ((await listenOn(port).catch(() => undefined)) !== undefined) return port;
  }
  return listenOn(0);
}

const slice = ((): { first: number; size: number; next: number } | undefined => {
  let ephemeralStart: number;
  try {
    ephemeralStart = Number(
      readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0],
    );
  } catch {
    return undefined;
  }
  const size = Math.floor((ephemeralStart - LOWEST) / SLICES);
  if (!(size >= 100)) return undefined;
  const worker = Number(process.env.JEST_WORKER_ID ?? 0) % SLICES;
  // A random start: the test file before this one in the same worker may have just let its
  // ports go.
  return { first: LOWEST + worker * size, size, next: Math.floor(Math.random() * size) };
})();

/** Listens exclusively on `port` (0: the kernel picks), closes, and returns the port. */
async function listenOn(port: number): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    server.listen({ port, host: '127.0.0.1', exclusive: true }, () => {
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
