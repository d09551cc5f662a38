import { Module } from '@nestjs/common';
import { HttpMetricsHook } from './http-metrics.hook';
import { MetricsController } from './metrics.controller';
import { MetricsService } from './metrics.service';

@Module({
  controllers: [MetricsController],
  providers: [MetricsService, HttpMetricsHook],
  exports: [MetricsService, HttpMetricsHook],
})
export class MetricsModule {}
