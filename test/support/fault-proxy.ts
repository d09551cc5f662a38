import { createConnection, createServer, type Server, type Socket } from 'node:net';

/** What the proxy currently does to traffic. */
export type FaultMode =
  | { kind: 'pass' }
  | { kind: 'latency'; ms: number }
  | { kind: 'blackhole' }
  | { kind: 'refuse' };

/** Counters since the proxy started. */
export interface FaultProxyStats {
  /** Client connections accepted and connected onwards (refused ones excluded). */
  connectionsAccepted: number;
  /** Client connections reset on arrival because the mode was `refuse`. */
  connectionsRefused: number;
  /** Connections currently open. */
  activeConnections: number;
  /** Bytes delivered from clients to the target. */
  bytesToTarget: number;
  /** Bytes delivered from the target to clients. */
  bytesToClient: number;
  /** Bytes received and thrown away because the mode was `blackhole`. */
  bytesDropped: number;
}

/** Options for {@link FaultProxy.start}. */
export interface FaultProxyOptions {
  /** The real server. */
  target: { host: string; port: number };
  /**
   * Port to listen on (e.g. to stand in for a proxy that was closed).
   * @default a free port chosen by the kernel
   */
  listenPort?: number;
  /** @default '127.0.0.1' */
  listenHost?: string;
}

/**
 * A TCP proxy for fault injection between a client and a server (Redis, an HTTP server),
 * switchable at runtime between pass-through, latency, blackhole and refusal.
 *
 * It works on bytes, not on a protocol: data dropped in `blackhole` mode is lost for good, so
 * a connection that carried traffic during a blackhole is out of sync with the server
 * afterwards; call {@link FaultProxy.cut} when lifting the fault so clients reconnect.
 *
 * Socket errors (ECONNRESET, EPIPE, a dead target) end the affected connection and never the
 * proxy or the test.
 */
export class FaultProxy {
  private current: FaultMode = { kind: 'pass' };
  private readonly pairs = new Set<Pair>();
  private readonly counters: Omit<FaultProxyStats, 'activeConnections'> = {
    connectionsAccepted: 0,
    connectionsRefused: 0,
    bytesToTarget: 0,
    bytesToClient: 0,
    bytesDropped: 0,
  };

  private constructor(
    private readonly server: Server,
    private target: { host: string; port: number },
    /** Address to connect clients to. */
    readonly host: string,
    /** Port to connect clients to. */
    readonly port: number,
  ) {
    server.on('connection', (socket) => this.accept(socket));
    // A listening server only errors on exotic failures (EMFILE); it must not crash the test.
    server.on('error', () => undefined);
  }

  /** Starts listening; the proxy begins in `pass` mode. */
  static async start(opts: FaultProxyOptions): Promise<FaultProxy> {
    const server = createServer({ noDelay: true });
    const host = opts.listenHost ?? '127.0.0.1';
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ port: opts.listenPort ?? 0, host }, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const address = server.address();
    if (address === null || typeof address === 'string') {
      server.close();
      throw new Error(`fault proxy: unexpected listen address ${String(address)}`);
    }
    return new FaultProxy(server, { ...opts.target }, host, address.port);
  }

  /** `<protocol>://host:port` of the proxy, e.g. `proxy.url('redis')`, `proxy.url('http')`. */
  url(protocol: string): string {
    return `${protocol}://${this.host}:${this.port}`;
  }

  /**
   * Sends *new* connections to `target` from now on, as a DNS name repointed to another node
   * does (an ElastiCache primary endpoint after a failover). Open connections stay where they
   * are: a client only moves when it reconnects.
   */
  retarget(target: { host: string; port: number }): void {
    this.target = { ...target };
  }

  /** The current mode. */
  get mode(): FaultMode {
    return { ...this.current };
  }

  /** Counters; a snapshot, so compare two reads to see what a step did. */
  get stats(): FaultProxyStats {
    return { ...this.counters, activeConnections: this.pairs.size };
  }

  /** Forwards everything unchanged. Data queued by `latency` is still delivered in order. */
  pass(): void {
    this.current = { kind: 'pass' };
  }

  /**
   * Delays every chunk by `ms` in each direction (so a request/response round trip gains
   * `2 * ms`). Order is preserved, also across later mode changes.
   */
  latency(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`latency must be >= 0 ms, got ${ms}`);
    this.current = { kind: 'latency', ms };
  }

  /**
   * Keeps connections open but silently drops all data both ways, like a network partition
   * where packets vanish: the client only notices through its own timeouts. New connections
   * are accepted (the TCP handshake succeeds) and are blackholed too.
   */
  blackhole(): void {
    this.current = { kind: 'blackhole' };
  }

  /**
   * Stops accepting: each new connection is reset as soon as it arrives, so clients fail
   * fast the way they do against a stopped server. Existing connections keep working.
   */
  refuse(): void {
    this.current = { kind: 'refuse' };
  }

  /**
   * Drops every current connection now (with a TCP reset), like a failover or a middlebox
   * timing out. The mode is unchanged, so clients reconnect to whatever it says.
   */
  cut(): void {
    for (const pair of [...this.pairs]) pair.destroy();
  }

  /** Destroys all connections and stops listening. */
  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket): void {
    client.on('error', () => undefined);
    if (this.current.kind === 'refuse') {
      this.counters.connectionsRefused++;
      client.resetAndDestroy();
      return;
    }
    this.counters.connectionsAccepted++;
    const upstream = createConnection({ host: this.target.host, port: this.target.port });
    const pair = new Pair(
      client,
      upstream,
      () => this.current,
      this.counters,
      () => this.pairs.delete(pair),
    );
    this.pairs.add(pair);
  }
}

type Counters = Omit<FaultProxyStats, 'activeConnections'>;

/** One client connection and its connection to the target. */
class Pair {
  private destroyed = false;
  private openSockets = 2;
  private readonly toTarget: Lane;
  private readonly toClient: Lane;

  constructor(
    private readonly client: Socket,
    private readonly upstream: Socket,
    mode: () => FaultMode,
    counters: Counters,
    private readonly onClosed: () => void,
  ) {
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    upstream.on('error', () => undefined);
    const reset = () => this.destroy();
    this.toTarget = new Lane(client, upstream, mode, counters, 'bytesToTarget', reset);
    this.toClient = new Lane(upstream, client, mode, counters, 'bytesToClient', reset);
    client.once('close', (hadError) => {
      this.socketClosed();
      // The connection to the target is ours alone: pass the client's goodbye on, after the
      // data still queued by `latency`, as a FIN or a reset like the client's.
      this.toTarget.finish(hadError ? 'reset' : 'end');
    });
    upstream.once('close', (hadError) => {
      this.socketClosed();
      // In a partition the client would not learn that the server went away either.
      if (mode().kind === 'blackhole') return;
      // A refused or reset target connection resets the client: it fails fast, as it would
      // against the server directly.
      this.toClient.finish(hadError ? 'reset' : 'end');
    });
  }

  /** Resets both connections now. */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.toTarget.stop();
    this.toClient.stop();
    // A reset rather than a FIN: the peer sees an abrupt failure, as with a real cut.
    resetSocket(this.client);
    resetSocket(this.upstream);
    this.onClosed();
  }

  private socketClosed(): void {
    this.openSockets--;
    if (this.openSockets === 0 && !this.destroyed) {
      this.destroyed = true;
      this.onClosed();
    }
  }
}

function resetSocket(socket: Socket): void {
  if (socket.destroyed) return;
  // Once its write side has ended (our FIN sent or queued), a plain destroy: the peer has seen
  // the end already, and Node (20, as tested here) never completes a reset issued after
  // `end()`: the process spun at 100 % CPU in its exit cleanup instead of exiting (the Jest run
  // of `test/redis-failover.e2e-spec.ts` never ended without --forceExit).
  if (socket.writableEnded) {
    socket.destroy();
    return;
  }
  try {
    socket.resetAndDestroy();
  } catch {
    // Not a TCP handle any more (closing already): a plain destroy ends it as well.
    socket.destroy();
  }
}

type Item = Buffer | 'end' | 'reset';

/** One direction of a {@link Pair}: forwards, delays or drops chunks from `from` to `to`. */
class Lane {
  private readonly queue: Array<{ at: number; item: Item }> = [];
  private timer: NodeJS.Timeout | undefined;
  /** Delivery time of the last queued item: a later one never overtakes it. */
  private lastAt = 0;
  private awaitingDrain = false;

  constructor(
    private readonly from: Socket,
    private readonly to: Socket,
    private readonly mode: () => FaultMode,
    private readonly counters: Counters,
    private readonly counter: 'bytesToTarget' | 'bytesToClient',
    private readonly reset: () => void,
  ) {
    from.on('data', (chunk: Buffer) => {
      const m = this.mode();
      switch (m.kind) {
        case 'blackhole':
          this.counters.bytesDropped += chunk.length;
          return;
        case 'pass':
        case 'refuse':
          this.enqueue(chunk, 0);
          return;
        case 'latency':
          this.enqueue(chunk, m.ms);
          return;
      }
    });
  }

  /** Ends (FIN) or resets the receiving side once everything queued has been delivered. */
  finish(how: 'end' | 'reset'): void {
    const m = this.mode();
    this.enqueue(how, m.kind === 'latency' ? m.ms : 0);
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.queue.length = 0;
  }

  private enqueue(item: Item, delayMs: number): void {
    if (delayMs === 0 && this.queue.length === 0) {
      this.deliver(item);
      return;
    }
    this.lastAt = Math.max(Date.now() + delayMs, this.lastAt);
    this.queue.push({ at: this.lastAt, item });
    this.schedule();
  }

  private schedule(): void {
    if (this.timer || this.queue.length === 0) return;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        const now = Date.now();
        while (this.queue.length > 0 && this.queue[0].at <= now) {
          const next = this.queue.shift();
          if (next) this.deliver(next.item);
        }
        this.schedule();
      },
      Math.max(0, this.queue[0].at - Date.now()),
    );
  }

  private deliver(item: Item): void {
    if (item === 'reset') {
      this.reset();
      return;
    }
    if (this.to.destroyed) return;
    if (item === 'end') {
      this.to.end();
      return;
    }
    this.counters[this.counter] += item.length;
    // Backpressure: a slow receiver pauses the sender instead of growing our buffer. (The
    // target socket may still be connecting; net.Socket buffers writes until it is.)
    if (!this.to.write(item) && !this.awaitingDrain) {
      this.awaitingDrain = true;
      this.from.pause();
      this.to.once('drain', () => {
        this.awaitingDrain = false;
        this.from.resume();
      });
    }
  }
}
