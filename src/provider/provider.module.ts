import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { DPOP_SIGNER, type DpopSigner } from '../dpop/dpop-proofs';
import { AuthServerClient } from './auth-server.client';
import { PROVIDER_API_GATEWAY, TOKEN_GRANTOR } from './provider.constants';
import { createCheckoutAgent, ProviderApiClient } from './provider-api.client';
import { createProviderAgent } from './provider-http';

/** Exports its ports only; each client owns its HTTP pools and closes them. */
@Module({
  providers: [
    {
      provide: TOKEN_GRANTOR,
      inject: [BROKER_CONFIG, DPOP_SIGNER],
      useFactory: (config: BrokerConfig, dpop: DpopSigner) =>
        new AuthServerClient(
          createProviderAgent(config.provider),
          config.provider,
          config.token.defaultLifetimeSeconds,
          Date.now,
          dpop,
        ),
    },
    {
      provide: PROVIDER_API_GATEWAY,
      inject: [BROKER_CONFIG, DPOP_SIGNER],
      useFactory: (config: BrokerConfig, dpop: DpopSigner) =>
        new ProviderApiClient(createCheckoutAgent(config.orders), config.orders, undefined, dpop),
    },
  ],
  exports: [TOKEN_GRANTOR, PROVIDER_API_GATEWAY],
})
export class ProviderModule implements OnApplicationShutdown {
  constructor(
    @Inject(TOKEN_GRANTOR) private readonly grantor: AuthServerClient,
    @Inject(PROVIDER_API_GATEWAY) private readonly api: ProviderApiClient,
  ) {}

  async onApplicationShutdown(): Promise<void> {
    await Promise.all([this.grantor.close(), this.api.close()]);
  }
}
