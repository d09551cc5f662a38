import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Agent } from 'undici';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { AuthServerClient } from './auth-server.client';
import {
  CHECKOUT_AGENT,
  PROVIDER_AGENT,
  STANDARD_TOKEN_CLIENT,
  PROVIDER_API_GATEWAY,
  TOKEN_GRANTOR,
} from './provider.constants';
import { createCheckoutAgent, ProviderApiClient } from './provider-api.client';
import { StandardTokenClient } from './standard-token.client';
import { TokenGrantorRouter } from './token-grantor.router';
import { createProviderAgent } from './provider-http';

/** Exports its ports only; the HTTP pools behind them stay inside. */
@Module({
  providers: [
    {
      provide: PROVIDER_AGENT,
      inject: [BROKER_CONFIG],
      useFactory: (config: BrokerConfig) => createProviderAgent(config.provider),
    },
    {
      provide: STANDARD_TOKEN_CLIENT,
      inject: [PROVIDER_AGENT, BROKER_CONFIG],
      useFactory: (agent: Agent, config: BrokerConfig) =>
        new StandardTokenClient(agent, config.provider, config.token.defaultLifetimeSeconds),
    },
    {
      provide: TOKEN_GRANTOR,
      inject: [PROVIDER_AGENT, STANDARD_TOKEN_CLIENT, BROKER_CONFIG],
      useFactory: (agent: Agent, standard: StandardTokenClient, config: BrokerConfig) =>
        new TokenGrantorRouter(
          new AuthServerClient(agent, config.provider, config.token.defaultLifetimeSeconds),
          standard,
        ),
    },
    {
      provide: CHECKOUT_AGENT,
      inject: [BROKER_CONFIG],
      useFactory: (config: BrokerConfig): Agent => createCheckoutAgent(config.orders),
    },
    {
      provide: PROVIDER_API_GATEWAY,
      inject: [CHECKOUT_AGENT, BROKER_CONFIG],
      useFactory: (agent: Agent, config: BrokerConfig) =>
        new ProviderApiClient(agent, config.orders),
    },
  ],
  exports: [TOKEN_GRANTOR, PROVIDER_API_GATEWAY],
})
export class ProviderModule implements OnApplicationShutdown {
  constructor(
    @Inject(PROVIDER_AGENT) private readonly agent: Agent,
    @Inject(PROVIDER_API_GATEWAY) private readonly api: ProviderApiClient,
    @Inject(STANDARD_TOKEN_CLIENT) private readonly standard: StandardTokenClient,
  ) {}

  async onApplicationShutdown(): Promise<void> {
    await Promise.all([this.agent.close(), this.api.close(), this.standard.close()]);
  }
}
