import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { request } from 'undici';

/** One backend of a {@link ServiceBalancer}: a broker's port and whether it takes new connections. */
interface Endpoint {
  port: number;
  /** Readiness as last probed. */
  ready: boolean;
  /** Removed by the "endpoints controller" (pod deleted): never chosen again. */
  removed: boolean;
}

/** Options for {@link ServiceBalancer.start}. */
export interface ServiceBalancerOptions {
  /** How often each endpoint's `GET /health/ready` is probed (a kubelet readiness probe). */
  probeIntervalMs: number;
  /**
   * How long after {@link ServiceBalancer.remove} the endpoint stops getting new connections:
   * the endpoints controller and kube-proxy updating their rules while the pod already has
   * SIGTERM.
   */
  propagationMs: number;
}

/**
 * A Kubernetes Service in miniature, for rolling-restart tests: an L4 (TCP) balancer that
 * picks a ready endpoint per new connection, round-robin, like kube-proxy. An established
 * connection stays with its pod until one side closes it, which is what makes drains hard:
 * callers holding keep-alive connections keep sending to a terminating pod unless it closes
 * them. Removal takes effect after a propagation delay, while readiness is probed on an
 * interval, so a pod that only stops accepting at SIGTERM is still sent connections.
 */
export class ServiceBalancer {
  private readonly endpoints: Endpoint[] = [];
  private readonly sockets = new Set<Socket>();
  private next = 0;
  private readonly timers = new Set<NodeJS.Timeout>();
  private probing: NodeJS.Timeout | undefined;
  /** Connections that found no ready endpoint and were reset. */
  noEndpoint = 0;

  private constructor(
    private readonly server: Server,
    readonly port: number,
    private readonly opts: ServiceBalancerOptions,
  ) {}

  static async start(opts: ServiceBalancerOptions): Promise<ServiceBalancer> {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    if (address === null || typeof address === 'string') throw new Error('no port');
    const balancer = new ServiceBalancer(server, address.port, opts);
    server.on('connection', (socket) => balancer.route(socket));
    balancer.probing = setInterval(() => void balancer.probe(), opts.probeIntervalMs);
    return balancer;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Adds a backend; it gets connections once its readiness probe passes. */
  add(port: number): void {
    this.endpoints.push({ port, ready: false, removed: false });
    void this.probe();
  }

  /** The pod is being deleted: no new connections to it after the propagation delay. */
  remove(port: number): void {
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      for (const e of this.endpoints) if (e.port === port) e.removed = true;
    }, this.opts.propagationMs);
    this.timers.add(timer);
  }

  /** Ports currently given new connections. */
  routable(): number[] {
    return this.endpoints.filter((e) => e.ready && !e.removed).map((e) => e.port);
  }

  async close(): Promise<void> {
    clearInterval(this.probing);
    for (const t of this.timers) clearTimeout(t);
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async probe(): Promise<void> {
    await Promise.all(
      this.endpoints
        .filter((e) => !e.removed)
        .map(async (e) => {
          try {
            const res = await request(`http://127.0.0.1:${e.port}/health/ready`, {
              headersTimeout: 1000,
              bodyTimeout: 1000,
            });
            await res.body.dump();
            e.ready = res.statusCode === 200;
          } catch {
            e.ready = false;
          }
        }),
    );
  }

  private route(client: Socket): void {
    const candidates = this.endpoints.filter((e) => e.ready && !e.removed);
    if (candidates.length === 0) {
      this.noEndpoint++;
      client.resetAndDestroy();
      return;
    }
    const target = candidates[this.next++ % candidates.length];
    const upstream = createConnection({ host: '127.0.0.1', port: target.port });
    this.sockets.add(client);
    this.sockets.add(upstream);
    const end = (): void => {
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    client.on('close', () => {
      upstream.destroySoon();
      end();
    });
    upstream.on('close', () => {
      client.destroySoon();
      end();
    });
    client.pipe(upstream);
    upstream.pipe(client);
  }
}
