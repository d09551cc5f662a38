import { Controller, Get, Header, Inject, Req } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import { BROKER_CONFIG } from '../config/config.constants';
import { type BrokerConfig, isDevelopmentEnv } from '../config/config.schema';
import { arrivedOnAdminListener } from '../http/listeners';
import { MetricsService } from '../metrics/metrics.service';
import { AdminService } from './admin.service';

/**
 * Open on the admin listener, which the chart keeps off the callers' network (and without one,
 * in development). On the callers' listener of a production broker without an admin listener,
 * the metrics name every client and caller, so they are an operator's read: scope `admin` and
 * every client (`"*"`), audited like the admin routes. With an admin listener, the callers'
 * listener never reaches this route (404, see `bootstrap.ts`).
 */
@Controller('metrics')
export class MetricsController {
  private readonly openOnCallersListener: boolean;

  constructor(
    private readonly metrics: MetricsService,
    private readonly admin: AdminService,
    @Inject(BROKER_CONFIG) config: BrokerConfig,
  ) {
    this.openOnCallersListener = isDevelopmentEnv(config.nodeEnv);
  }

  @Get()
  @Header('content-type', 'text/plain; version=0.0.4; charset=utf-8')
  @Header('cache-control', 'no-store')
  async render(@Req() req: FastifyRequest): Promise<string> {
    if (!this.openOnCallersListener && !arrivedOnAdminListener(req.raw.socket)) {
      await this.admin.run(req, 'metrics', undefined, () => Promise.resolve());
    }
    return this.metrics.registry.metrics();
  }
}
