import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Counter, type Registry } from 'prom-client';

/**
 * The `route` label of requests that matched no route (404s, scanners probing random paths).
 * One fixed value: a raw URL as a label would let any caller create unbounded series.
 */
export const UNMATCHED_ROUTE = 'unmatched';

/** The metric's name, part of the dashboards' and alerts' contract. */
export const HTTP_REQUESTS_METRIC = 'token_broker_http_requests_total';

type HttpLabel = 'route' | 'method' | 'status';

/** One (route, method, status) series, counted with a plain increment on the request path. */
interface Cell {
  readonly labels: Readonly<Record<HttpLabel, string>>;
  count: number;
  /** How much of `count` prom-client has already been given. */
  reported: number;
}

/**
 * `token_broker_http_requests_total{route,method,status}`, counted by a Fastify `onResponse`
 * hook so every route is covered: Nest controllers, routes registered directly on Fastify
 * (`GET /token`) and the not-found handler.
 *
 * `route` is the route *pattern* Fastify matched (`/orders/:id`, never `/orders/42`), or
 * {@link UNMATCHED_ROUTE}. `method` comes from Node's HTTP parser, which only accepts its fixed
 * list of methods, and `status` is a number below 600: the series are bounded by the routes the
 * app registers, not by what callers send.
 *
 * Why not `counter.labels(...).inc()` per request: prom-client re-hashes the label object on
 * every `inc()`, even through a child from `labels()`. `GET /token` must stay close to a bare
 * Node server, so the hook only bumps a number in a cached cell, and the increments are handed
 * to prom-client when Prometheus scrapes (`collect`).
 */
export class HttpRequestCounter {
  readonly counter: Counter<HttpLabel>;
  /** route pattern -> method -> cells indexed by status code. */
  private readonly cells = new Map<string, Map<string, Cell[]>>();
  private readonly allCells: Cell[] = [];

  constructor(registry: Registry) {
    this.counter = new Counter({
      name: HTTP_REQUESTS_METRIC,
      help: 'HTTP requests answered, by route pattern (or "unmatched"), method and status code.',
      labelNames: ['route', 'method', 'status'] as const,
      registers: [registry],
      collect: () => this.flush(),
    });
  }

  /**
   * Adds the `onResponse` hook. Fastify attaches hooks to every route when it becomes ready, so
   * routes registered before this call are counted too; call it before `listen`/`ready`.
   */
  attach(fastify: FastifyInstance): void {
    fastify.addHook(
      'onResponse',
      (req: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void) => {
        this.record(req.routeOptions.url, req.method, reply.statusCode);
        done();
      },
    );
  }

  /** Counts one answered request. `routePattern` is the matched route pattern, if any. */
  record(routePattern: string | undefined, method: string, status: number): void {
    const route = routePattern ?? UNMATCHED_ROUTE;
    let byMethod = this.cells.get(route);
    if (byMethod === undefined) {
      byMethod = new Map();
      this.cells.set(route, byMethod);
    }
    let byStatus = byMethod.get(method);
    if (byStatus === undefined) {
      byStatus = [];
      byMethod.set(method, byStatus);
    }
    const cell = byStatus[status] ?? this.newCell(byStatus, route, method, status);
    cell.count++;
  }

  private newCell(byStatus: Cell[], route: string, method: string, status: number): Cell {
    const cell: Cell = { labels: { route, method, status: String(status) }, count: 0, reported: 0 };
    byStatus[status] = cell;
    this.allCells.push(cell);
    return cell;
  }

  /** Hands the increments since the last scrape to prom-client. */
  private flush(): void {
    for (const cell of this.allCells) {
      const delta = cell.count - cell.reported;
      if (delta > 0) {
        this.counter.inc(cell.labels, delta);
        cell.reported = cell.count;
      }
    }
  }
}
