import { Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Counter, type Registry } from 'prom-client';
import { MetricsService } from './metrics.service';

/** For requests that matched no route: a raw URL as a label would let callers create series. */
export const UNMATCHED_ROUTE = 'unmatched';

/** Part of the dashboards' and alerts' contract. */
export const HTTP_REQUESTS_METRIC = 'token_broker_http_requests_total';

type HttpLabel = 'route' | 'method' | 'status';

interface Cell {
  readonly labels: Readonly<Record<HttpLabel, string>>;
  /** Since the last scrape. */
  count: number;
}

/**
 * `route` is the pattern Fastify matched, `method` is from Node's fixed list and `status` below
 * 600: series are bounded by the app's routes, not by callers. prom-client re-hashes labels on
 * every `inc()`, so the hot path bumps a cached cell and prom-client gets the counts at scrape.
 */
export class HttpRequestCounter {
  readonly counter: Counter<HttpLabel>;
  /** route pattern -> method -> cells indexed by status. */
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

  /** Hooks attach to every route when Fastify becomes ready: call it before `listen`/`ready`. */
  attach(fastify: FastifyInstance): void {
    fastify.addHook(
      'onResponse',
      (req: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void) => {
        this.record(req.routeOptions.url, req.method, reply.statusCode);
        done();
      },
    );
  }

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
    let cell = byStatus[status];
    if (cell === undefined) {
      cell = { labels: { route, method, status: String(status) }, count: 0 };
      byStatus[status] = cell;
      this.allCells.push(cell);
    }
    cell.count++;
  }

  private flush(): void {
    for (const cell of this.allCells) {
      if (cell.count > 0) this.counter.inc(cell.labels, cell.count);
      cell.count = 0;
    }
  }
}

/** A provider, so the `GET /token` front counts into the same cells as the Fastify routes. */
@Injectable()
export class HttpMetricsHook implements OnModuleInit {
  readonly requests: HttpRequestCounter;

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    metrics: MetricsService,
  ) {
    this.requests = new HttpRequestCounter(metrics.registry);
  }

  onModuleInit(): void {
    // Hooks are bound to routes when Fastify becomes ready, after onModuleInit.
    this.requests.attach(this.adapterHost.httpAdapter.getInstance<FastifyInstance>());
  }
}
