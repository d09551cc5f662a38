import {
  Inject,
  Injectable,
  type OnApplicationBootstrap,
  type BeforeApplicationShutdown,
} from '@nestjs/common';
import type { Logger } from 'pino';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import { TOKEN_GRANTOR } from '../provider/provider.constants';
import type { TokenGrantor } from '../provider/auth-server.client';
import { loadClientCredentials } from '../secrets/client-credentials';
import type { SecretReader } from '../secrets/secret-reader';
import { SECRET_READER } from '../secrets/secrets.constants';
import { ClientTokenManager, type ClientTokenStatus } from './client-token-manager';
import type { TokenRecord } from './token-record';
import { TOKEN_STORE, type TokenStore } from './token-store';
import { TokenErrorCode, TokenException } from './token.exception';

/** What a configured client id looks like (`config.schema.ts`); other input is not echoed. */
const CLIENT_ID_SHAPE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/**
 * Holds one {@link ClientTokenManager} per configured client and routes requests to them.
 * Orders and the HTTP layer use this service, never the managers' collaborators directly.
 */
@Injectable()
export class TokenService implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly managers = new Map<string, ClientTokenManager>();
  /** The client used when a request names none: only when exactly one is configured. */
  private readonly soleClient?: ClientTokenManager;

  constructor(
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(TOKEN_STORE) private readonly store: TokenStore,
    @Inject(TOKEN_GRANTOR) grantor: TokenGrantor,
    @Inject(SECRET_READER) secrets: SecretReader,
    @Inject(LOGGER) private readonly logger: Logger,
    metrics: MetricsService,
  ) {
    for (const client of config.clients) {
      this.managers.set(
        client.id,
        new ClientTokenManager(client, {
          store,
          grantor,
          loadCredentials: (c) => loadClientCredentials(secrets, c.credentials),
          metrics,
          logger,
          settings: config.token,
          storeGraceMs: Math.max(500, 2 * config.redis.commandTimeoutMs),
        }),
      );
    }
    if (this.managers.size === 1) this.soleClient = [...this.managers.values()][0];
    store.onEvent((e) => this.managers.get(e.clientId)?.onStoreEvent(e));
    store.onRecovered(() => {
      for (const m of this.managers.values()) void m.resync();
    });
    metrics.setDegradedSource(() => store.kind === 'redis' && !store.healthy);
  }

  async onApplicationBootstrap(): Promise<void> {
    // Wait (bounded) for Redis before the first refresh: a replica that started without it
    // would fetch its own token instead of sharing the fleet's.
    const ready = await this.store.waitUntilReady(this.config.redis.connectTimeoutMs);
    if (!ready) {
      this.logger.warn(
        'Redis did not answer at start-up; starting degraded (per-replica refresh) until it does',
      );
    }
    for (const m of this.managers.values()) m.start();
  }

  /**
   * Before the adapters close: let in-flight refreshes finish and release their locks. Bounded
   * by half the shutdown grace period, so closing the listener and Redis still fits in it.
   */
  async beforeApplicationShutdown(): Promise<void> {
    const timeoutMs = Math.min(5000, Math.floor(this.config.http.shutdownGraceMs / 2));
    await Promise.all([...this.managers.values()].map((m) => m.stop(timeoutMs)));
  }

  /**
   * The manager for `clientId`, or for the sole client when none is named. Throws 400/404
   * problems that say what to send.
   */
  manager(clientId: string | undefined): ClientTokenManager {
    if (clientId === undefined) {
      if (this.soleClient) return this.soleClient;
      throw new TokenException(
        TokenErrorCode.ClientRequired,
        `several clients are configured; pass ?client=<id> (one of: ${[...this.managers.keys()].join(', ')})`,
      );
    }
    const m = this.managers.get(clientId);
    if (!m) {
      // Echo the id only when it could be one: caller input of any length or content (an
      // access token pasted into the wrong parameter) must not come back in bodies or logs.
      const named = CLIENT_ID_SHAPE.test(clientId) ? `"${clientId}"` : 'with the requested id';
      throw new TokenException(
        TokenErrorCode.UnknownClient,
        `no client ${named} is configured on this broker`,
      );
    }
    return m;
  }

  /** A token for `clientId` with at least `minRemainingMs` left (waits in the mandatory window). */
  getToken(clientId: string, minRemainingMs: number): Promise<TokenRecord> {
    return this.manager(clientId).get(minRemainingMs);
  }

  /** Generation-aware invalidation: see {@link ClientTokenManager.invalidate}. */
  invalidate(clientId: string, fingerprint: string): Promise<boolean> {
    return this.manager(clientId).invalidate(fingerprint);
  }

  status(): { store: { kind: string; healthy: boolean }; clients: ClientTokenStatus[] } {
    return {
      store: { kind: this.store.kind, healthy: this.store.healthy },
      clients: [...this.managers.values()].map((m) => m.status()),
    };
  }
}
