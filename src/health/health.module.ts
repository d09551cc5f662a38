import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { TokenModule } from '../token/token.module';
import { HealthController } from './health.controller';

@Module({
  imports: [TerminusModule.forRoot({ logger: false }), TokenModule],
  controllers: [HealthController],
})
export class HealthModule {}
