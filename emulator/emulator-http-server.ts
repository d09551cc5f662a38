import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/** Where an emulator listens. */
export interface EmulatorListenOptions {
  /** TCP port; `0` or absent picks a free one, so parallel test files never collide. */
  port?: number;
  /** Interface to bind. @default '127.0.0.1' (loopback: tests never expose an emulator) */
  host?: string;
}

/** The body of a request, read up to a cap. */
export interface RequestBody {
  /** The bytes read; empty when `tooLarge`. */
  bytes: Buffer;
  /** The client sent more than the cap; the rest was read and discarded. */
  tooLarge: boolean;
}

/** Handles one request; a rejection becomes a 500 (or a dropped connection) rather than a crash. */
export type EmulatorHandler = (req: IncomingMessage, res: ServerResponse) => Promise<void>;

/**
 * A bare `node:http` server for emulators: it knows every socket and timer it owns so that
 * `close()` can end hung requests (the point of a "timeout" fault) and let jest exit.
 */
export class EmulatorHttpServer {
  private readonly timers = new Set<NodeJS.Timeout>();
  private closing?: Promise<void>;

  private constructor(
    private readonly server: Server,
    private readonly sockets: ReadonlySet<Socket>,
    /** Base URL, `http://host:port`, no trailing slash. */
    readonly url: string,
    /** The port actually bound. */
    readonly port: number,
  ) {}

  /** Listens on `opts.port` (random when 0/absent) and serves every request with `handler`. */
  static async listen(
    opts: EmulatorListenOptions,
    handler: EmulatorHandler,
  ): Promise<EmulatorHttpServer> {
    const sockets = new Set<Socket>();
    const server = createServer((req, res) => {
      // A client that hangs up mid-request makes these emit 'error'; unhandled, that would
      // take the whole test process down.
      req.on('error', () => undefined);
      res.on('error', () => undefined);
      handler(req, res).catch(() => {
        if (!res.headersSent && !res.destroyed) {
          sendJson(res, 500, { error: 'emulator_error' });
        } else {
          res.destroy();
        }
      });
    });
    server.on('connection', (socket) => {
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
    });
    const host = opts.host ?? '127.0.0.1';
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(opts.port ?? 0, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const { port } = server.address() as AddressInfo;
    const urlHost = host.includes(':') ? `[${host}]` : host;
    return new EmulatorHttpServer(server, sockets, `http://${urlHost}:${port}`, port);
  }

  /**
   * Resolves after `ms`. After `close()` it never resolves: the request it delays is ended by
   * destroying its socket, not by answering late into a closed emulator.
   */
  async delay(ms: number): Promise<void> {
    if (this.closing) return new Promise<void>(() => undefined);
    if (ms <= 0) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.timers.delete(timer);
        resolve();
      }, ms);
      this.timers.add(timer);
    });
  }

  /** Stops listening and destroys every open socket, including ones with hung requests. */
  async close(): Promise<void> {
    this.closing ??= new Promise<void>((resolve) => {
      for (const timer of this.timers) clearTimeout(timer);
      this.timers.clear();
      this.server.close(() => resolve());
      for (const socket of this.sockets) socket.destroy();
    });
    return this.closing;
  }
}

/**
 * Reads a request body, keeping at most `cap` bytes. Past the cap it keeps draining and
 * discarding so the client can still read the answer (a client still writing when the
 * server hangs up tends to see EPIPE instead of the status). `null` if the client went away.
 */
export async function readBody(req: IncomingMessage, cap: number): Promise<RequestBody | null> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let tooLarge = false;
    let settled = false;
    const settle = (value: RequestBody | null) => {
      if (settled) return;
      settled = true;
      resolve(value);
    };
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > cap) {
        tooLarge = true;
        chunks.length = 0;
      } else {
        chunks.push(chunk);
      }
    });
    req.once('end', () =>
      settle({ bytes: tooLarge ? Buffer.alloc(0) : Buffer.concat(chunks), tooLarge }),
    );
    req.once('error', () => settle(null));
    req.once('close', () => settle(null));
  });
}

/** Answers with a JSON body, unless the client is already gone. */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
  contentType = 'application/json',
): void {
  send(res, status, JSON.stringify(body), { 'content-type': contentType, ...headers });
}

/** Answers with a raw body, unless the client is already gone. */
export function send(
  res: ServerResponse,
  status: number,
  body: string,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { ...headers, 'content-length': String(Buffer.byteLength(body)) });
  res.end(body);
}

/** The media type of a Content-Type header, lowercased and without parameters. */
export function mediaType(header: string | undefined): string | undefined {
  return header?.split(';', 1)[0].trim().toLowerCase();
}

/** Parses a request target; `null` for one even the WHATWG parser rejects. */
export function parseTarget(req: IncomingMessage): URL | null {
  try {
    return new URL(req.url ?? '/', 'http://emulator.invalid');
  } catch {
    return null;
  }
}
