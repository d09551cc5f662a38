import { Global, Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Agent } from 'undici';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { AuthServerClient } from './auth-server.client';
import { PROVIDER_AGENT, TOKEN_GRANTOR } from './provider.constants';
import { createProviderAgent } from './provider-http';

/** The provider adapter: its HTTP pool and the token endpoint client. */
@Global()
@Module({
  providers: [
    {
      provide: PROVIDER_AGENT,
      inject: [BROKER_CONFIG],
      useFactory: (config: BrokerConfig) => createProviderAgent(config.provider),
    },
    {
      provide: TOKEN_GRANTOR,
      inject: [PROVIDER_AGENT, BROKER_CONFIG],
      useFactory: (agent: Agent, config: BrokerConfig) =>
        new AuthServerClient(agent, config.provider, config.token.defaultLifetimeSeconds),
    },
  ],
  exports: [PROVIDER_AGENT, TOKEN_GRANTOR],
})
export class ProviderModule implements OnApplicationShutdown {
  constructor(@Inject(PROVIDER_AGENT) private readonly agent: Agent) {}

  async onApplicationShutdown(): Promise<void> {
    await this.agent.close();
  }
}
