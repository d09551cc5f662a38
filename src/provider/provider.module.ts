import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Agent } from 'undici';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { AuthServerClient } from './auth-server.client';
import { CheckoutClient, type CheckoutGateway, createCheckoutAgent } from './checkout.client';
import { CHECKOUT_GATEWAY, PROVIDER_AGENT, TOKEN_GRANTOR } from './provider.constants';
import { createProviderAgent } from './provider-http';

/**
 * The provider adapter. Exports its two ports only: the token endpoint ({@link TOKEN_GRANTOR})
 * and the checkout API ({@link CHECKOUT_GATEWAY}); the HTTP pools behind them stay inside.
 */
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
    {
      // Its own pool, sized and timed for orders (ORDERS_*), apart from the token endpoint's.
      provide: CHECKOUT_GATEWAY,
      inject: [BROKER_CONFIG],
      useFactory: (config: BrokerConfig): CheckoutGateway =>
        new CheckoutClient(createCheckoutAgent(config.orders), config.orders),
    },
  ],
  exports: [TOKEN_GRANTOR, CHECKOUT_GATEWAY],
})
export class ProviderModule implements OnApplicationShutdown {
  constructor(
    @Inject(PROVIDER_AGENT) private readonly agent: Agent,
    @Inject(CHECKOUT_GATEWAY) private readonly checkout: CheckoutGateway,
  ) {}

  async onApplicationShutdown(): Promise<void> {
    await Promise.all([this.agent.close(), this.checkout.close()]);
  }
}
