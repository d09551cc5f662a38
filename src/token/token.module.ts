import { Module } from '@nestjs/common';
import { TokenRoute } from './token.route';
import { TokenService } from './token.service';

/** The token lifecycle and `GET /token`. */
@Module({
  providers: [TokenService, TokenRoute],
  exports: [TokenService],
})
export class TokenModule {}
