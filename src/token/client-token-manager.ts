import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { TokenSettings } from '../config/config.schema';
import type { HitCell, MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { ClientCredentials } from '../secrets/client-credentials';
import { CredentialsCache, SECRETS_MANAGER_ROTATION_STAGES } from '../secrets/credentials-cache';
import { FleetRefresh, type Forced, noteStoreFailure } from './fleet-refresh';
import { HeldToken } from './held-token';
import { RefreshLoop } from './refresh-loop';
import type { TokenRecord } from './token-record';
import { RejectionLedger } from './rejection-ledger';
import type {
  EndpointCap,
  RejectionRule,
  RejectionVerdict,
  StoredToken,
  TokenStore,
  TokenStoreEvent,
} from './token-store';

/** How often {@link ClientTokenManager.replacementAfter} looks. */
const REPLACEMENT_POLL_MS = 25;

interface ManagerDeps {
  store: TokenStore;
  grantor: TokenGrantor;
  /** `stage`: a Secrets Manager staging label instead of the current one. */
  loadCredentials: (client: ClientConfig, stage?: string) => Promise<ClientCredentials>;
  metrics: MetricsService;
  logger: Logger;
  settings: TokenSettings;
  storeGraceMs: number;
  /** The fleet's bound on requests to a token endpoint; absent: none. */
  endpointCap?: EndpointCap;
  now?: () => number;
  random?: () => number;
}

/**
 * One client's token lifecycle: L1 (a {@link HeldToken}), L2 (the shared store), source (the
 * provider), with one refresh loop per process and bounded waits for callers who need more.
 */
export class ClientTokenManager {
  private readonly held: HeldToken;
  private readonly loop: RefreshLoop;
  private readonly refresh: FleetRefresh;
  /**
   * Set while {@link resync} runs: callers wait for it rather than start a refresh the
   * set-aside token may be about to cover.
   */
  private resyncing?: Promise<void>;
  private readonly localRejections: RejectionLedger;
  private readonly now: () => number;
  readonly l1Hits: HitCell;
  readonly credentials: CredentialsCache;

  constructor(
    readonly client: ClientConfig,
    private readonly deps: ManagerDeps,
  ) {
    this.now = deps.now ?? Date.now;
    this.localRejections = new RejectionLedger(this.now);
    this.held = new HeldToken(client.id, { metrics: deps.metrics, now: this.now });
    this.l1Hits = deps.metrics.l1HitCell(client.id);
    this.credentials = new CredentialsCache(
      (stage) => deps.loadCredentials(client, stage),
      deps.settings.credentialsReloadSeconds * 1000,
      this.now,
      client.credentials.secretId !== undefined ? SECRETS_MANAGER_ROTATION_STAGES : [],
    );
    this.refresh = new FleetRefresh(client, {
      ...deps,
      credentials: this.credentials,
      minRefreshIntervalMs: deps.settings.minRefreshIntervalMs,
      now: this.now,
    });
    this.loop = new RefreshLoop(client, {
      ...deps,
      refresh: this.refresh,
      held: this.held,
      now: this.now,
      random: deps.random ?? Math.random,
      syncGeneration: () => this.syncGeneration(),
    });
  }

  /**
   * `seed`: this client's record, read with every other client's at start; adopted as
   * {@link adoptFromStore} would, so the loop's first pass finds it and reads nothing.
   */
  start(seed?: StoredToken): void {
    if (seed?.status === 'found') {
      this.deps.metrics.cacheLookups.labels(this.client.id, 'l2', 'hit').inc();
      this.syncGeneration();
      if (this.held.mayHold(seed.record) && this.held.outlastedBy(seed.record)) {
        this.loop.adopt(seed.record);
        this.held.noteRefresh('adopted');
      }
    }
    this.loop.ensureRefreshing('start');
  }

  stop(timeoutMs: number): Promise<void> {
    return this.loop.stop(timeoutMs);
  }

  peek(minRemainingMs: number): TokenRecord | undefined {
    return this.held.servable(minRemainingMs);
  }

  get(minRemainingMs: number): Promise<TokenRecord> {
    return this.obtain(minRemainingMs, (ms) => this.peek(ms));
  }

  /** For a call the broker forwards: never a token the provider refused. */
  getForwardable(minRemainingMs: number): Promise<TokenRecord> {
    return this.obtain(minRemainingMs, (ms) => this.held.forwardable(ms));
  }

  /** What `pick` finds held, after a resync in progress if need be, else the refresh's token. */
  private async obtain(
    minRemainingMs: number,
    pick: (minRemainingMs: number) => TokenRecord | undefined,
  ): Promise<TokenRecord> {
    const hit = pick(minRemainingMs);
    if (hit) return hit;
    if (this.resyncing !== undefined) {
      await this.resyncing;
      const back = pick(minRemainingMs);
      if (back) return back;
    }
    return this.loop.waitFor(minRemainingMs);
  }

  /**
   * `caller`'s call saw the provider refuse the token with `fingerprint`. The refusal costs a
   * token request only within the fleet's rejection floor and the caller's budget; the refused
   * token is still served to `GET /token` until its replacement is in hand.
   */
  async reject(fingerprint: string, caller: string): Promise<RejectionVerdict> {
    const { settings, store, logger } = this.deps;
    const rule: RejectionRule = {
      caller,
      floorMs: settings.minRejectionIntervalMs,
      perCaller: settings.rejectionsPerCaller,
      windowMs: settings.rejectionWindowSeconds * 1000,
    };
    const inStore = store.records.invalidate(this.client.id, fingerprint, rule);
    // The store is down: this replica's own floor and budget, for the token it holds alone.
    const verdict =
      (await this.refresh.orIfStoreFails(inStore, undefined)) ??
      this.rejectLocally(fingerprint, rule);
    if (verdict === 'invalidated' || verdict === 'stale') {
      if (this.held.reject(fingerprint) && verdict === 'invalidated') {
        logger.warn(
          { client: this.client.id, fingerprint, caller },
          'provider rejected the current token; refreshing (the token is still served to GET /token until its replacement is in hand)',
        );
      }
      this.loop.ensureRefreshing('rejected');
    }
    return verdict;
  }

  private rejectLocally(fingerprint: string, rule: RejectionRule): RejectionVerdict {
    const held = this.held.current;
    if (held?.fingerprint !== fingerprint || this.held.isRejected(held)) return 'stale';
    const admitted = this.localRejections.admit(this.client.id, rule);
    return admitted === 'ok' ? 'invalidated' : admitted;
  }

  onStoreEvent(event: TokenStoreEvent): void {
    if (event.type === 'revoked') {
      if (event.fingerprint !== undefined) this.held.refuse(event.fingerprint);
      this.refresh.liftLocalFloor();
      this.syncGeneration();
      return;
    }
    if (event.type === 'invalidated') {
      // Another replica saw the provider refuse it: it is no better here.
      if (this.held.reject(event.fingerprint)) this.loop.ensureRefreshing('invalidated');
      return;
    }
    // Our own token (we wrote it, or already adopted it): nothing to re-read, unless it was
    // refused (the provider may have granted the same token again). Anything else is re-read,
    // and the adoption keeps whichever of the two expires later.
    const cur = this.held.current;
    if (cur !== undefined && event.fingerprint === cur.fingerprint && !this.held.isRejected(cur)) {
      return;
    }
    // A running loop is waiting for exactly this: it re-reads now instead of at its next poll.
    if (this.loop.running) this.loop.ring();
    else void this.adoptFromStore();
  }

  /** The store is back after an outage; concurrent calls (both connections) share one run. */
  resync(): Promise<void> {
    this.resyncing ??= this.resyncOnce().finally(() => (this.resyncing = undefined));
    return this.resyncing;
  }

  private async resyncOnce(): Promise<void> {
    const held = this.held.current;
    if (!this.held.needsResync && held === undefined) return;
    // A revoke may have been missed while the store was down: serve nothing until the
    // generation is read.
    this.held.setAside();
    try {
      await this.refresh.readShared();
      this.syncGeneration(held);
      if (held && this.held.ofGeneration(held) && held.expiresAt > this.now()) {
        if (this.held.current === undefined) this.loop.adopt(held);
        await this.deps.store.records.writeFenced(this.client.id, held);
      }
      this.held.needsResync = false;
      await this.adoptFromStore();
      this.deps.logger.info({ client: this.client.id }, 'shared store back; token resynchronised');
    } catch (err) {
      // Down again: back to serving what this replica holds, as during any outage.
      this.held.restore(held);
      noteStoreFailure(this.deps.logger, this.client.id, err);
    }
  }

  async forceRefresh(askedAt: number): Promise<Forced> {
    const result = await this.refresh.forced(askedAt, this.deps.settings.waitTimeoutMs);
    this.syncGeneration();
    if (this.held.ofGeneration(result.record)) {
      this.loop.adopt(result.record, result.fetched, true);
      // The fleet's message about this token may have reached this replica first and noted it
      // as adopted: this replica's own request is what happened here.
      this.held.noteRefresh(result.fetched ? 'fetched' : 'adopted', true);
    }
    return result;
  }

  /** The token held once it is of `generation` or later; undefined past `timeoutMs`. */
  async replacementAfter(generation: number, timeoutMs: number): Promise<TokenRecord | undefined> {
    const deadline = this.now() + timeoutMs;
    for (;;) {
      const r = this.held.valid();
      if (r !== undefined && (r.generation ?? 0) >= generation) return r;
      if (this.now() >= deadline) return undefined;
      await sleep(REPLACEMENT_POLL_MS);
    }
  }

  /** Fingerprints, never tokens. */
  adminStatus() {
    const r = this.held.valid();
    const failure = this.loop.failure;
    return {
      fingerprint: r?.fingerprint,
      expiresAt: r?.expiresAt,
      obtainedAt: r?.obtainedAt,
      generation: this.held.generation,
      lastRefresh: this.held.lastRefresh,
      lastError: failure?.permanent?.operatorDetail ?? failure?.lastError.message,
      refreshing: this.loop.running,
    };
  }

  /**
   * A token of an older generation (revoked while held) is dropped, never adopted again, and
   * replaced. `held`: a token set aside by {@link resync}, judged too.
   */
  private syncGeneration(held?: TokenRecord): void {
    const generation = this.deps.store.bus.generation(this.client.id);
    if (generation <= this.held.generation) return;
    const dropped = this.held.revoke(generation, held);
    if (dropped !== undefined) {
      this.deps.logger.warn(
        { client: this.client.id, fingerprint: dropped.fingerprint, generation },
        'token revoked fleet-wide; dropped and refreshing',
      );
    }
    const ack = this.deps.store.bus.acknowledgeRevocation(this.client.id, generation);
    void this.refresh.orIfStoreFails(ack, undefined);
    if (this.held.current === undefined) this.loop.ensureRefreshing('revoked');
  }

  status() {
    const r = this.held.valid();
    const failure = this.loop.failure;
    return {
      client: this.client.id,
      hasToken: r !== undefined,
      expiresAt: r?.expiresAt,
      refreshing: this.loop.running,
      // A failure that needs an operator (credentials refused or unreadable).
      permanentError: failure?.permanent
        ? { code: failure.permanent.code, message: failure.permanent.operatorDetail }
        : undefined,
      lastError: failure?.lastError.message,
      // Set while the provider's tokens live too short to serve and refresh them.
      lifetimeError: this.loop.lifetimeError,
      everObtained: this.held.everObtained,
    };
  }

  private async adoptFromStore(): Promise<void> {
    const r = await this.refresh.orIfStoreFails(this.refresh.readShared(), undefined);
    this.syncGeneration();
    if (r && this.held.mayHold(r) && this.held.outlastedBy(r)) {
      this.loop.adopt(r);
      this.held.noteRefresh('adopted');
    }
  }
}
