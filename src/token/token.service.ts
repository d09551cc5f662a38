import type { ClientConfig } from '../config/client.schema';
import {
  Inject,
  Injectable,
  type OnApplicationBootstrap,
  type BeforeApplicationShutdown,
} from '@nestjs/common';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { assertMayUse, mayUse, namedClient } from '../caller-auth/caller-authorization';
import { BROKER_CONFIG } from '../config/config.constants';
import { type BrokerConfig, tokenCallDeadlineMs } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import { TOKEN_GRANTOR } from '../provider/provider.constants';
import type { TokenGrantor } from '../provider/auth-server.client';
import { loadClientCredentials } from '../secrets/client-credentials';
import { SECRET_READER, type SecretReader } from '../secrets/secret-reader';
import { servable } from './client-readiness';
import { ClientTokenManager } from './client-token-manager';
import { StoreContinuityWatch } from './store-continuity.watch';
import type { TokenRecord } from './token-record';
import { type FleetBus, type RejectionVerdict, TOKEN_STORE, type TokenStore } from './token-store';
import { tracedGrantor, tracedTokenStore } from './traced-ports';
import { TokenErrorCode, TokenException } from './token.exception';

/** The token layer as other modules see it; the per-client managers behind it stay private. */
@Injectable()
export class TokenService implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly managers = new Map<string, ClientTokenManager>();
  /** Used when a request names no client: only when exactly one is configured. */
  private readonly soleClient?: ClientTokenManager;
  private readonly continuity: StoreContinuityWatch;
  /** Fleet-wide operations: revocations and reload requests, heard by every replica. */
  readonly fleet: FleetBus;

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
          store: tracedTokenStore(store),
          grantor: tracedGrantor(grantor),
          loadCredentials: (c, stage) =>
            loadClientCredentials(secrets, c.credentials, c.tokenRequest.auth, stage),
          metrics,
          logger,
          settings: config.token,
          storeGraceMs: Math.max(500, 2 * config.redis.commandTimeoutMs),
          endpointCap: {
            concurrency: config.token.endpointMaxConcurrency,
            perSecond: config.token.endpointRatePerSecond,
            // A dead holder's place comes back once its request could no longer be running.
            leaseMs: tokenCallDeadlineMs(config.provider) + 1000,
          },
        }),
      );
    }
    if (this.managers.size === 1) this.soleClient = [...this.managers.values()][0];
    this.fleet = store.bus;
    store.records.onEvent((e) => this.managers.get(e.clientId)?.onStoreEvent(e));
    this.continuity = new StoreContinuityWatch(
      store.health,
      config.clients.map((c) => c.id),
      metrics,
      logger,
      config.redis.pingIntervalMs,
    );
    store.health.onRecovered(() => {
      // Redis may be back empty: say so before the replicas push their tokens into it.
      void this.continuity.check();
      for (const m of this.managers.values()) void m.resync();
    });
    metrics.setDegradedSource(() => store.health.kind === 'redis' && !store.health.healthy);
    metrics.setClientSource(() =>
      [...this.managers.values()].map((m) => {
        const s = m.status();
        return { client: s.client, expiresAt: s.expiresAt, servable: servable(s) };
      }),
    );
    metrics.setStoreStateSource(() =>
      store.health.kind === 'redis' ? store.health.topology().state : undefined,
    );
  }

  async onApplicationBootstrap(): Promise<void> {
    const ready = await this.store.health.waitUntilReady(this.config.redis.connectTimeoutMs);
    if (!ready) {
      this.logger.warn(
        'Redis did not answer at start-up; starting degraded (per-replica refresh) until it does',
      );
    }
    for (const m of this.managers.values()) m.start();
    this.continuity.start();
  }

  /** Bounded by half the shutdown grace, so closing the listener and Redis still fits in it. */
  async beforeApplicationShutdown(): Promise<void> {
    this.continuity.stop();
    const timeoutMs = Math.min(5000, Math.floor(this.config.http.shutdownGraceMs / 2));
    await Promise.all([...this.managers.values()].map((m) => m.stop(timeoutMs)));
  }

  /**
   * `requested` (`?client=`), or the sole client. With `caller`, a client outside its grant is
   * 403 whether configured or not, and the 400 lists only clients it may use: it learns nothing.
   */
  resolveClient(requested: string | undefined, caller?: Caller): string {
    if (requested === undefined) {
      if (this.soleClient === undefined) throw this.clientRequired(caller);
      if (caller !== undefined) assertMayUse(caller, this.soleClient.client.id);
      return this.soleClient.client.id;
    }
    if (caller !== undefined) assertMayUse(caller, requested, this.managers.has(requested));
    return this.manager(requested).client.id;
  }

  private clientRequired(caller: Caller | undefined): TokenException {
    const usable = [...this.managers.keys()].filter((id) => !caller || mayUse(caller, id));
    return new TokenException(
      TokenErrorCode.ClientRequired,
      usable.length > 0
        ? `several clients are configured; pass ?client=<id> (one of: ${usable.join(', ')})`
        : `several clients are configured and caller "${caller!.name}" may use none of them; ask the platform team to grant one`,
    );
  }

  /** Hot path, counted as an L1 hit. No I/O, no promise. */
  peek(clientId: string, minRemainingMs: number): TokenRecord | undefined {
    const m = this.managers.get(clientId);
    if (m === undefined) return undefined;
    const hit = m.peek(minRemainingMs);
    if (hit !== undefined) m.l1Hits.count++;
    return hit;
  }

  /** The largest `min_ttl` (seconds) a caller may ask: the refresh-ahead lead. */
  get maxMinTtlSeconds(): number {
    return this.config.token.refreshAheadSeconds;
  }

  async getToken(clientId: string, minRemainingMs: number): Promise<TokenRecord> {
    return this.manager(clientId).get(minRemainingMs);
  }

  /** A token for a call the broker forwards: never one the provider refused. */
  async getForwardToken(clientId: string, minRemainingMs: number): Promise<TokenRecord> {
    return this.manager(clientId).getForwardable(minRemainingMs);
  }

  /**
   * `caller`'s call saw the provider reject the token with `fingerprint`: never forwarded again,
   * and invalidated in the store only if still current, within the fleet's rejection floor and
   * the caller's budget, so neither a storm of rejections nor one caller's 401s cost more than
   * one refresh per floor.
   */
  async replaceRejected(
    clientId: string,
    fingerprint: string,
    caller: string,
  ): Promise<RejectionVerdict> {
    return this.manager(clientId).reject(fingerprint, caller);
  }

  /** This replica's token of `generation` or later, once it holds one within `timeoutMs`. */
  replacementAfter(
    clientId: string,
    generation: number,
    timeoutMs: number,
  ): Promise<TokenRecord | undefined> {
    return this.manager(clientId).replacementAfter(generation, timeoutMs);
  }

  /** `readiness.requiredClients`: each must be servable for the replica to be ready. */
  get requiredClients(): readonly string[] {
    return this.config.readiness.requiredClients;
  }

  status() {
    const { kind, healthy, configurationError } = this.store.health;
    return {
      store: { kind, healthy, configurationError },
      clients: [...this.managers.values()].map((m) => m.status()),
    };
  }

  async forceRefresh(clientId: string, askedAt: number) {
    const { record, fetched, written } = await this.manager(clientId).forceRefresh(askedAt);
    return { fingerprint: record.fingerprint, expiresAt: record.expiresAt, fetched, written };
  }

  async reloadCredentials(): Promise<{ changed: string[]; firstRead: string[]; failed: string[] }> {
    const outcomes = await Promise.all(
      [...this.managers.values()].map(async (m) => {
        try {
          return { id: m.client.id, outcome: await m.credentials.reload() };
        } catch (err) {
          this.logger.error(
            { client: m.client.id, err: err instanceof Error ? err.message : String(err) },
            'reloading the client credentials failed; keeping the ones already loaded',
          );
          return { id: m.client.id, outcome: 'failed' as const };
        }
      }),
    );
    const ids = (outcome: string) =>
      outcomes.flatMap((o) => (o.outcome === outcome ? [o.id] : [])).sort();
    return { changed: ids('changed'), firstRead: ids('first'), failed: ids('failed') };
  }

  /** The clients `caller` may use. */
  async adminStatus(caller: Caller) {
    const usable = [...this.managers.values()].filter((m) => mayUse(caller, m.client.id));
    const clients = await Promise.all(
      usable.map(async (m) => {
        const id = m.client.id;
        const lock = await this.store.lock.lockState(id).catch(() => ({
          error: 'the shared store did not answer',
        }));
        const { grant, auth } = m.client.tokenRequest;
        return { client: id, tokenRequest: { grant, auth }, ...m.adminStatus(), lock };
      }),
    );
    return { store: this.store.health.topology(), clients };
  }

  /** A configured client's settings (throws `unknown_client`). */
  clientConfig(clientId: string): ClientConfig {
    return this.manager(clientId).client;
  }

  private manager(clientId: string): ClientTokenManager {
    const m = this.managers.get(clientId);
    if (!m) {
      throw new TokenException(
        TokenErrorCode.UnknownClient,
        `no client ${namedClient(clientId)} is configured on this broker`,
      );
    }
    return m;
  }
}
