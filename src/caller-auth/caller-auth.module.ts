import { Global, Module } from '@nestjs/common';
import { AllowAllAuthenticator } from './allow-all.authenticator';
import { CALLER_AUTHENTICATOR } from './caller';

/** Caller authentication for every route but health and metrics. */
@Global()
@Module({
  providers: [{ provide: CALLER_AUTHENTICATOR, useFactory: () => new AllowAllAuthenticator() }],
  exports: [CALLER_AUTHENTICATOR],
})
export class CallerAuthModule {}
