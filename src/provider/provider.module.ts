import { Inject, Module, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import type { Logger } from 'pino';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { DPOP_SIGNER, type DpopSigner } from '../dpop/dpop-proofs';
import { LOGGER } from '../logging/logger';
import { loadClientCredentials } from '../secrets/client-credentials';
import { SECRET_READER, type SecretReader } from '../secrets/secret-reader';
import { SecretsModule } from '../secrets/secrets.module';
import { AuthServerClient } from './auth-server.client';
import { ClientAgents } from './client-tls';
import { PROVIDER_API_GATEWAY, PROVIDER_METADATA, TOKEN_GRANTOR } from './provider.constants';
import { ClientCertificates, createCheckoutAgent, ProviderApiClient } from './provider-api.client';
import { createProviderAgent } from './provider-http';
import { ProviderMetadataCache } from './provider-metadata';

/** Shared by the token endpoint adapter and the API one: a mutual-TLS client's certificate. */
const CLIENT_CERTIFICATES = 'TOKEN_BROKER:CLIENT_CERTIFICATES';

/** Exports its ports only; each client owns its HTTP pools and closes them. */
@Module({
  imports: [SecretsModule],
  providers: [
    {
      provide: CLIENT_CERTIFICATES,
      inject: [BROKER_CONFIG, SECRET_READER],
      useFactory: (config: BrokerConfig, secrets: SecretReader) =>
        new ClientCertificates(
          (c) => loadClientCredentials(secrets, c.credentials, c.tokenRequest.auth),
          config.token.credentialsReloadSeconds * 1000,
        ),
    },
    {
      provide: PROVIDER_METADATA,
      inject: [BROKER_CONFIG, LOGGER],
      useFactory: (config: BrokerConfig, logger: Logger) => {
        // Pools of its own (a `caFile`'s per client), apart from the token requests'.
        const shared = createProviderAgent(config.provider);
        const agents = new ClientAgents(
          (options) => createProviderAgent(config.provider, options),
          config.token.credentialsReloadSeconds * 1000,
        );
        return new ProviderMetadataCache({
          dispatcherFor: (client, what) => agents.agentFor(client, undefined, what) ?? shared,
          close: async () => void (await Promise.all([agents.close(), shared.close()])),
          settings: config.provider,
          logger,
        });
      },
    },
    {
      provide: TOKEN_GRANTOR,
      inject: [BROKER_CONFIG, PROVIDER_METADATA, CLIENT_CERTIFICATES, DPOP_SIGNER],
      useFactory: (
        config: BrokerConfig,
        metadata: ProviderMetadataCache,
        certificates: ClientCertificates,
        dpop: DpopSigner,
      ) =>
        new AuthServerClient(
          createProviderAgent(config.provider),
          config.provider,
          config.token.defaultLifetimeSeconds,
          Date.now,
          {
            metadata,
            onGranted: (client, credentials) => certificates.granted(client, credentials),
            caMaxAgeMs: config.token.credentialsReloadSeconds * 1000,
            dpop,
          },
        ),
    },
    {
      provide: PROVIDER_API_GATEWAY,
      inject: [BROKER_CONFIG, CLIENT_CERTIFICATES, DPOP_SIGNER],
      useFactory: (config: BrokerConfig, certificates: ClientCertificates, dpop: DpopSigner) =>
        new ProviderApiClient(
          createCheckoutAgent(config.orders),
          config.orders,
          undefined,
          certificates,
          config.token.credentialsReloadSeconds * 1000,
          dpop,
        ),
    },
  ],
  exports: [TOKEN_GRANTOR, PROVIDER_API_GATEWAY, PROVIDER_METADATA],
})
export class ProviderModule implements OnModuleInit, OnApplicationShutdown {
  constructor(
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(TOKEN_GRANTOR) private readonly grantor: AuthServerClient,
    @Inject(PROVIDER_API_GATEWAY) private readonly api: ProviderApiClient,
    @Inject(PROVIDER_METADATA) private readonly metadata: ProviderMetadataCache,
  ) {}

  /** Each `tokenRequest.issuer` is read at start; a failure is that client's alone. */
  onModuleInit(): void {
    this.metadata.start(this.config.clients);
  }

  async onApplicationShutdown(): Promise<void> {
    await Promise.all([this.grantor.close(), this.api.close(), this.metadata.close()]);
  }
}
