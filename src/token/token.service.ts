import {
  Inject,
  Injectable,
  type OnApplicationBootstrap,
  type BeforeApplicationShutdown,
} from '@nestjs/common';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { assertMayUse, mayUse, namedClient } from '../caller-auth/caller-authorization';
import type { ClientConfig } from '../config/client.schema';
import { BROKER_CONFIG } from '../config/config.constants';
import { type ClientChanges, clientChanges } from '../config/config-reload';
import { type BrokerConfig, tokenCallDeadlineMs } from '../config/config.schema';
import { LOGGER } from '../logging/logger';
import { MetricsService } from '../metrics/metrics.service';
import { TOKEN_GRANTOR } from '../provider/provider.constants';
import type { TokenGrantor } from '../provider/auth-server.client';
import { loadClientCredentials } from '../secrets/client-credentials';
import { SECRET_READER, type SecretReader } from '../secrets/secret-reader';
import { servable } from './client-readiness';
import { ClientTokenManager } from './client-token-manager';
import { EndpointGates } from './endpoint-limiter';
import { StoreContinuityWatch } from './store-continuity.watch';
import type { TokenRecord } from './token-record';
import {
  type FleetBus,
  type RejectionVerdict,
  type StoredToken,
  TOKEN_STORE,
  type TokenStore,
} from './token-store';
import { TokenStoreException } from './token-store.exception';
import { tracedGrantor, tracedTokenStore } from './traced-ports';
import { TokenErrorCode, TokenException } from './token.exception';

/** The token layer as other modules see it; the per-client managers behind it stay private. */
@Injectable()
export class TokenService implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly managers = new Map<string, ClientTokenManager>();
  /** Used when a request names no client: only when exactly one is configured. */
  private soleClient?: ClientTokenManager;
  private readonly continuity: StoreContinuityWatch;
  /** Fleet-wide operations: revocations and reload requests, heard by every replica. */
  readonly fleet: FleetBus;
  /** The client list and readiness list in force: the start-up ones until a reload. */
  private clients: readonly ClientConfig[];
  private required: readonly string[];
  /** Reloads apply one at a time, in order. */
  private applying: Promise<unknown> = Promise.resolve();
  private closing = false;
  private readonly newManager: (client: ClientConfig) => ClientTokenManager;

  constructor(
    @Inject(BROKER_CONFIG) private readonly config: BrokerConfig,
    @Inject(TOKEN_STORE) private readonly store: TokenStore,
    @Inject(TOKEN_GRANTOR) grantor: TokenGrantor,
    @Inject(SECRET_READER) secrets: SecretReader,
    @Inject(LOGGER) private readonly logger: Logger,
    private readonly metrics: MetricsService,
  ) {
    this.clients = config.clients;
    this.required = config.readiness.requiredClients;
    // One for every client's manager: a copy per client cost a few hundred bytes each.
    const deps = {
      store: tracedTokenStore(store),
      grantor: tracedGrantor(grantor),
      loadCredentials: (c: ClientConfig, stage?: string) =>
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
      gates: new EndpointGates(),
    };
    this.newManager = (client) => new ClientTokenManager(client, deps);
    for (const client of config.clients) this.managers.set(client.id, this.newManager(client));
    this.noteSoleClient();
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
        const { client, expiresAt, state, failures } = s;
        return { client, expiresAt, servable: servable(s), state, failures };
      }),
    );
    metrics.setStoreStateSource(() =>
      store.health.kind === 'redis' ? store.health.topology().state : undefined,
    );
  }

  private noteSoleClient(): void {
    this.soleClient = this.managers.size === 1 ? [...this.managers.values()][0] : undefined;
  }

  async onApplicationBootstrap(): Promise<void> {
    const ready = await this.store.health.waitUntilReady(this.config.redis.connectTimeoutMs);
    if (!ready) {
      this.logger.warn(
        'Redis did not answer at start-up; starting degraded (per-replica refresh) until it does',
      );
    }
    await this.startManagers([...this.managers.values()], ready);
    this.continuity.start();
  }

  /**
   * Every client's stored token read at once and handed to its manager, whose first pass then
   * reads nothing: a replica joining a fleet of a thousand clients costs a few commands, not a
   * thousand. Without an answer, each manager reads its own, as it would anyway.
   */
  private async startManagers(
    managers: readonly ClientTokenManager[],
    storeReady = true,
    given: ReadonlyMap<string, StoredToken> = new Map(),
  ): Promise<void> {
    const unread = managers.filter((m) => !given.has(m.client.id));
    const seeds =
      storeReady && unread.length > 0
        ? await this.store.records
            .readMany(unread.map((m) => m.client.id))
            .catch((err: unknown) => {
              if (!(err instanceof TokenStoreException)) throw err;
              this.logger.debug({ err: err.message }, 'reading every stored token at once failed');
              return undefined;
            })
        : undefined;
    for (const m of managers) m.start(given.get(m.client.id) ?? seeds?.get(m.client.id));
  }

  /**
   * Starts a manager for each new client (its token adopted from the store or fetched, as at
   * start), stops each removed one (its waiters refused with `unknown_client`, its metric series
   * dropped, its Redis keys left to the replicas that still serve it) and replaces each changed
   * one; a client whose change touches only where its calls are forwarded keeps its token.
   * `next` is a whole validated configuration; its other settings wait for a restart. Reloads
   * apply one at a time, in order.
   */
  applyClients(next: BrokerConfig): Promise<ClientChanges> {
    const run = this.applying.then(() => this.applyNow(next));
    this.applying = run.catch(() => undefined);
    return run;
  }

  private async applyNow(next: BrokerConfig): Promise<ClientChanges> {
    // Shutting down: nothing more starts.
    if (this.closing) return { added: [], removed: [], changed: [] };
    const diff = clientChanges(this.clients, next.clients);
    const byId = new Map(next.clients.map((c) => [c.id, c]));
    const kept = new Set(diff.forwardingOnly);
    const replaced = diff.changed.map((id) => this.managers.get(id)!);
    const removed = diff.removed.map((id) => this.managers.get(id)!);
    const ids = next.clients.map((c) => c.id);
    // Subscribed before the read: a token stored between the two must reach the new manager.
    await this.store.records.follow(ids).catch((err: unknown) => {
      if (!(err instanceof TokenStoreException)) throw err;
      this.logger.warn(
        { err: err.message },
        'subscribing to the new clients failed; they re-read on recovery',
      );
    });
    const held = new Map<string, StoredToken>();
    for (const old of replaced) {
      const record = kept.has(old.client.id) ? old.peek(0) : undefined;
      if (record !== undefined) held.set(old.client.id, { status: 'found', record });
    }
    const started = [...diff.added, ...diff.changed].map((id) => {
      const m = this.newManager(byId.get(id)!);
      this.managers.set(id, m);
      return m;
    });
    // The map follows the new file's order, as at start: removed clients are left out.
    const ordered = ids.map((id) => [id, this.managers.get(id)!] as const);
    this.managers.clear();
    for (const [id, m] of ordered) this.managers.set(id, m);
    this.clients = next.clients;
    this.required = next.readiness.requiredClients;
    this.noteSoleClient();
    this.continuity.follow(ids);
    const timeoutMs = Math.min(5000, Math.floor(this.config.http.shutdownGraceMs / 2));
    for (const m of [...replaced, ...removed]) void m.stop(timeoutMs);
    for (const id of diff.removed) this.metrics.forgetClient(id);
    await this.startManagers(started, this.store.health.healthy, held);
    const changes = { added: diff.added, removed: diff.removed, changed: diff.changed };
    if (changes.added.length + changes.removed.length + changes.changed.length > 0) {
      this.logger.info(
        { ...changes, keptToken: diff.forwardingOnly },
        'client list reloaded: new clients started, removed ones stopped, changed ones replaced',
      );
    }
    return changes;
  }

  /** A client's configuration as in force now (a reload may have replaced it). */
  clientConfig(clientId: string): ClientConfig {
    return this.manager(clientId).client;
  }

  isConfigured(clientId: string): boolean {
    return this.managers.has(clientId);
  }

  /** Bounded by half the shutdown grace, so closing the listener and Redis still fits in it. */
  async beforeApplicationShutdown(): Promise<void> {
    this.closing = true;
    await this.applying;
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
    return this.onManager(clientId, (m) => m.get(minRemainingMs));
  }

  /** A token for a call the broker forwards: never one the provider refused. */
  async getForwardToken(clientId: string, minRemainingMs: number): Promise<TokenRecord> {
    return this.onManager(clientId, (m) => m.getForwardable(minRemainingMs));
  }

  /**
   * A wait cut short because a reload stopped the manager: asked again of the one that replaced
   * it, or refused as for a client never configured once it is removed.
   */
  private async onManager<T>(
    clientId: string,
    op: (m: ClientTokenManager) => Promise<T>,
  ): Promise<T> {
    const m = this.manager(clientId);
    try {
      return await op(m);
    } catch (err) {
      const now = this.managers.get(clientId);
      if (now === m) throw err;
      if (now !== undefined) return op(now);
      throw new TokenException(
        TokenErrorCode.UnknownClient,
        `client ${namedClient(clientId)} was removed from the configuration while the request waited`,
      );
    }
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
    return this.required;
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
