import { Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance } from 'fastify';
import { HttpRequestCounter } from './http-request.counter';
import { MetricsService } from './metrics.service';

/**
 * Counts every HTTP request by route pattern, method and status
 * (`token_broker_http_requests_total`, see {@link HttpRequestCounter}). A provider rather than
 * code in `bootstrap.ts`, so the tests' and the sandbox's apps count exactly like production.
 */
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
    // Absent in a Nest application context without HTTP (a test module): nothing to count.
    const adapter = this.adapterHost.httpAdapter as HttpAdapterHost['httpAdapter'] | undefined;
    if (adapter === undefined) return;
    // onModuleInit runs before Fastify is ready, which is when hooks are bound to routes.
    this.requests.attach(adapter.getInstance<FastifyInstance>());
  }
}
