import { Module } from '@nestjs/common';
import { TokenFastPath } from './token-fast-path';
import { TokenRoute } from './token.route';
import { TokenService } from './token.service';

/** The token lifecycle and `GET /token`. */
@Module({
  providers: [TokenService, TokenRoute, TokenFastPath],
  exports: [TokenService],
})
export class TokenModule {}
