import { Controller, Get, Header } from '@nestjs/common';
import { MetricsService } from './metrics.service';

/** The chart keeps it off the callers' network. */
@Controller('metrics')
export class MetricsController {
  constructor(private readonly metrics: MetricsService) {}

  @Get()
  @Header('content-type', 'text/plain; version=0.0.4; charset=utf-8')
  @Header('cache-control', 'no-store')
  render(): Promise<string> {
    return this.metrics.registry.metrics();
  }
}
