import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import { BROKER_CONFIG } from '../config/config.constants';
import { LOGGER } from '../logging/logger';
import { SECRET_READER } from '../secrets/secrets.constants';
import { SecretsModule } from '../secrets/secrets.module';
import { CALLER_AUTHENTICATOR, type CallerAuthenticator } from './caller';
import { createCallerAuthenticator } from './caller-authenticator.factory';

/** Every route but health, metrics and the OpenAPI document. */
@Module({
  imports: [SecretsModule],
  providers: [
    {
      provide: CALLER_AUTHENTICATOR,
      inject: [BROKER_CONFIG, SECRET_READER, LOGGER],
      useFactory: createCallerAuthenticator,
    },
  ],
  exports: [CALLER_AUTHENTICATOR],
})
export class CallerAuthModule implements OnApplicationShutdown {
  constructor(@Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator) {}

  onApplicationShutdown(): void {
    this.auth.close?.();
  }
}
