import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { FastifyInstance } from 'fastify';
import { describedRoutes, openApiDocument } from './openapi';
import { SECURITY_HEADERS } from '../http/security-headers';

const OPENAPI_PATH = '/openapi.json';

/**
 * No caller authentication: the document holds no secret and no configuration value. At
 * start-up it warns about routes the document and Fastify disagree on; the document's test
 * reads that line from real broker processes.
 */
@Injectable()
export class OpenApiRoute implements OnModuleInit {
  /** Serialized on the first request: most replicas are never asked. */
  private body?: string;
  /** `GET /token` is answered before the router (`TokenFront`). */
  private readonly registered: string[] = ['GET /token'];
  private readonly logger = new Logger('OpenApi');

  constructor(private readonly adapterHost: HttpAdapterHost) {
    this.fastify().addHook('onRoute', (route) => {
      // HEAD is Fastify's automatic twin of each GET: described by the GET.
      for (const method of [route.method].flat()) {
        if (method !== 'HEAD') this.registered.push(`${method} ${route.url}`);
      }
    });
    // Routes registered in encapsulated plugins (orders, the OAuth endpoint) exist only once
    // Fastify has loaded its plugins: compare then.
    this.fastify().addHook('onReady', (done) => {
      this.compare();
      done();
    });
  }

  onModuleInit(): void {
    this.fastify().route({
      method: 'GET',
      url: OPENAPI_PATH,
      handler: (_req, reply) =>
        reply
          .headers({
            'content-type': 'application/json; charset=utf-8',
            'cache-control': 'max-age=300',
            ...SECURITY_HEADERS,
          })
          .send((this.body ??= JSON.stringify(openApiDocument()))),
    });
  }

  private compare(): void {
    const described = describedRoutes();
    const undocumented = this.registered.filter((r) => !described.includes(r));
    const unserved = described.filter((r) => !this.registered.includes(r));
    this.logger.debug(`routes registered: ${JSON.stringify([...this.registered].sort())}`);
    if (undocumented.length > 0 || unserved.length > 0) {
      this.logger.warn(
        `${OPENAPI_PATH} is out of date: undocumented ${JSON.stringify(undocumented)}, not served ${JSON.stringify(unserved)}`,
      );
    }
  }

  private fastify(): FastifyInstance {
    return this.adapterHost.httpAdapter.getInstance<FastifyInstance>();
  }
}
