import { Module } from '@nestjs/common';
import { HttpMetricsHook } from './http-metrics.hook';
import { MetricsService } from './metrics.service';

@Module({
  providers: [MetricsService, HttpMetricsHook],
  exports: [MetricsService, HttpMetricsHook],
})
export class MetricsModule {}
