import { Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance } from 'fastify';
import { HttpRequestCounter } from './http-request.counter';
import { MetricsService } from './metrics.service';

/** A provider rather than code in `bootstrap.ts`, so the tests' and sandbox's apps count alike. */
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
