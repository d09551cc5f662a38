import { type DynamicModule, Inject, Module, type OnApplicationBootstrap } from '@nestjs/common';
import type { Logger } from 'pino';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { SECRET_READER, type SecretReader } from '../secrets/secret-reader';
import { SecretsModule } from '../secrets/secrets.module';
import { DPOP_SIGNER, DpopProofs } from './dpop-proofs';
import { DPOP_STORE, type DpopStore } from './dpop-store';

/**
 * Global: the provider adapters sign with it. The store implements this folder's port, so it is
 * handed in by {@link DpopModule.withStore}.
 */
@Module({})
export class DpopModule implements OnApplicationBootstrap {
  constructor(
    @Inject(DPOP_SIGNER) private readonly proofs: DpopProofs,
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(LOGGER) private readonly logger: Logger,
  ) {}

  static withStore(store: DynamicModule['module']): DynamicModule {
    return {
      module: DpopModule,
      global: true,
      imports: [store, SecretsModule],
      providers: [
        {
          provide: DPOP_SIGNER,
          inject: [SECRET_READER, DPOP_STORE],
          useFactory: (secrets: SecretReader, store: DpopStore) => new DpopProofs(secrets, store),
        },
      ],
      exports: [DPOP_SIGNER],
    };
  }

  /** A bad key is named at start; the broker still starts, and each use tries again. */
  async onApplicationBootstrap(): Promise<void> {
    try {
      await this.proofs.preload(this.config.clients);
    } catch (err) {
      this.logger.error({ err }, 'a DPoP proof key cannot be loaded; its client cannot get tokens');
    }
  }
}
