import type { Logger } from 'pino';
import type { ClientConfig, TokenSettings } from '../config/config.schema';
import type { HitCell, MetricsService, RefreshResult } from '../metrics/metrics.service';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { ClientCredentials } from '../secrets/client-credentials';
import { SecretsException } from '../secrets/secrets.exception';
import { isDue, refreshAt, retryDelayMs } from './refresh-schedule';
import { type TokenRecord, toRecord } from './token-record';
import type { TokenStore, TokenStoreEvent } from './token-store';
import { TokenStoreException } from './token-store.exception';
import { TokenErrorCode, TokenException } from './token.exception';

/** Never hand out a token with less than this left: it could expire on the wire. */
export const MIN_SERVE_MS = 1000;

/** Collaborators of one client's manager; shared across clients. */
export interface ManagerDeps {
  store: TokenStore;
  grantor: TokenGrantor;
  loadCredentials: (client: ClientConfig) => Promise<ClientCredentials>;
  metrics: MetricsService;
  logger: Logger;
  settings: TokenSettings;
  /**
   * How long the shared store must keep failing before this replica refreshes on its own
   * (a couple of Redis command timeouts): one late reply is not an outage.
   */
  storeGraceMs: number;
  now?: () => number;
  random?: () => number;
}

interface Waiter {
  needUntil: number;
  resolve: (r: TokenRecord) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/** What the last refresh attempt left behind, for readiness and error messages. */
export interface ClientTokenStatus {
  client: string;
  hasToken: boolean;
  expiresAt?: number;
  refreshing: boolean;
  /** A failure that needs an operator (credentials refused or unreadable). */
  permanentError?: { code: TokenErrorCode; message: string };
  lastError?: string;
  nextAttemptAt?: number;
  everObtained: boolean;
}

/** Outcome of one pass of the refresh loop. */
type Attempt = { kind: 'token'; record: TokenRecord; fetched: boolean } | { kind: 'wait' };

/**
 * One client's token lifecycle: L1 (this object), L2 (the shared store), source (provider).
 *
 * - Hot path: {@link peek} reads L1 synchronously; no I/O.
 * - Refresh: a single loop per process (the single flight), started by the refresh-ahead timer,
 *   by a caller in the mandatory window, by an invalidation, or by a store event. Each pass
 *   re-reads L2, takes the fleet lock, re-reads L2 inside it, and only then asks the provider;
 *   the result is written with a fenced compare-and-set. If the store is down, the pass asks
 *   the provider directly: at most one call per replica per lifetime, since the loop stops as
 *   soon as it holds a token that is not yet due.
 * - Failures: capped exponential backoff with full jitter; the current token keeps being
 *   served until it expires.
 */
export class ClientTokenManager {
  private l1?: TokenRecord;
  private loop?: Promise<void>;
  private readonly waiters = new Set<Waiter>();
  private refreshTimer?: NodeJS.Timeout;
  private wake?: () => void;
  private credentials?: ClientCredentials;
  private credentialsLoadedAt = 0;
  private failures = 0;
  private lastError?: Error;
  private permanentError?: TokenException;
  private nextAttemptAt?: number;
  private everObtained = false;
  /** Lifetime of the newest token held (ms): what a refresh can offer a caller at most. */
  private lifetimeMs?: number;
  private needsResync = false;
  /** When the current run of store failures began (undefined while the store answers). */
  private storeFailingSince?: number;
  private stopped = false;
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly refreshAheadMs: number;
  private readonly remainingGauge;
  /** Hot-path hit counter (see {@link MetricsService.l1HitCell}). */
  readonly l1Hits: HitCell;

  constructor(
    readonly client: ClientConfig,
    private readonly deps: ManagerDeps,
  ) {
    this.now = deps.now ?? Date.now;
    this.random = deps.random ?? Math.random;
    this.refreshAheadMs = deps.settings.refreshAheadSeconds * 1000;
    this.remainingGauge = deps.metrics.tokenRemaining.labels(client.id);
    this.l1Hits = deps.metrics.l1HitCell(client.id);
  }

  /** Starts the lifecycle: load credentials and obtain the first token in the background. */
  start(): void {
    this.ensureRefreshing('start');
  }

  /**
   * Stops timers and retries, waits (bounded) for a refresh in flight to finish, then fails
   * the waiters it did not answer. Waiters are failed last, not first: callers already waiting
   * for the refresh this replica is doing (SIGTERM mid-refresh) get its token instead of a 503.
   */
  async stop(timeoutMs = 5000): Promise<void> {
    this.stopped = true;
    clearTimeout(this.refreshTimer);
    // A loop sleeping between attempts ends now; one inside an attempt finishes it first.
    this.wake?.();
    if (this.loop) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.loop,
        new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs))),
      ]);
      clearTimeout(timer);
    }
    for (const w of this.waiters) {
      clearTimeout(w.timer);
      w.reject(new TokenException(TokenErrorCode.ShuttingDown, 'the broker is shutting down', 1));
    }
    this.waiters.clear();
  }

  /** Hot path: the L1 token if it has at least `minRemainingMs` left. No I/O, no promise. */
  peek(minRemainingMs: number): TokenRecord | undefined {
    const r = this.l1;
    return r !== undefined && r.expiresAt - this.now() >= Math.max(minRemainingMs, MIN_SERVE_MS)
      ? r
      : undefined;
  }

  /**
   * A token with at least `minRemainingMs` left. Answers from L1 when it can; otherwise this
   * is the mandatory window: wait (bounded by `waitTimeoutMs`) for the single refresh.
   */
  async get(
    minRemainingMs: number,
    waitTimeoutMs = this.deps.settings.waitTimeoutMs,
  ): Promise<TokenRecord> {
    const hit = this.peek(minRemainingMs);
    if (hit) return hit;
    if (this.stopped) {
      throw new TokenException(TokenErrorCode.ShuttingDown, 'the broker is shutting down', 1);
    }
    // Fail fast: an operator must fix this; the loop keeps probing in the background.
    if (this.permanentError) throw this.permanentError;
    // Even a brand-new token could not meet this: refuse now instead of fetching one per
    // such request (a caller looping with a too large min_ttl would hammer the provider).
    if (this.lifetimeMs !== undefined && minRemainingMs >= this.lifetimeMs) {
      throw this.lifetimeTooShort(this.lifetimeMs);
    }
    const needUntil = this.now() + Math.max(minRemainingMs, MIN_SERVE_MS);
    const result = new Promise<TokenRecord>((resolve, reject) => {
      const waiter: Waiter = {
        needUntil,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters.delete(waiter);
          reject(this.unavailableError());
        }, waitTimeoutMs),
      };
      this.waiters.add(waiter);
    });
    this.ensureRefreshing('demand');
    return result;
  }

  /**
   * Generation-aware invalidation: the provider rejected the token with `fingerprint`. Drop it
   * only if it is still the current one, here and in the store, so a storm of rejections of
   * one stale token costs a single refresh.
   */
  async invalidate(fingerprint: string): Promise<boolean> {
    let invalidated = false;
    if (this.l1?.fingerprint === fingerprint) {
      this.l1 = undefined;
      this.remainingGauge.set(0);
      invalidated = true;
      this.deps.logger.warn(
        { client: this.client.id, fingerprint },
        'provider rejected the current token; refreshing',
      );
    }
    try {
      invalidated = (await this.deps.store.invalidate(this.client.id, fingerprint)) || invalidated;
    } catch (err) {
      this.noteStoreFailure(err);
    }
    if (invalidated) this.ensureRefreshing('invalidated');
    return invalidated;
  }

  /** A message from the shared store (another replica refreshed or invalidated). */
  onStoreEvent(event: TokenStoreEvent): void {
    if (event.type === 'invalidated') {
      if (this.l1?.fingerprint === event.fingerprint) {
        this.l1 = undefined;
        this.remainingGauge.set(0);
        this.ensureRefreshing('invalidated');
      }
      return;
    }
    if (this.l1 !== undefined && event.expiresAt <= this.l1.expiresAt) return;
    if (this.loop) {
      // The loop is waiting for exactly this: let it re-read now instead of at its next poll.
      this.wake?.();
    } else {
      void this.adoptFromStore();
    }
  }

  /** The store is reachable again after an outage: push our token, converge on the newest. */
  async resync(): Promise<void> {
    if (!this.needsResync && this.l1 === undefined) return;
    try {
      if (this.l1 && this.l1.expiresAt > this.now()) {
        await this.deps.store.writeFenced(this.client.id, this.l1);
      }
      this.needsResync = false;
      await this.adoptFromStore();
      this.deps.logger.info({ client: this.client.id }, 'shared store back; token resynchronised');
    } catch (err) {
      this.noteStoreFailure(err);
    }
  }

  status(): ClientTokenStatus {
    const r = this.l1 && this.l1.expiresAt > this.now() ? this.l1 : undefined;
    return {
      client: this.client.id,
      hasToken: r !== undefined,
      expiresAt: r?.expiresAt,
      refreshing: this.loop !== undefined,
      permanentError: this.permanentError
        ? { code: this.permanentError.code, message: this.permanentError.message }
        : undefined,
      lastError: this.lastError?.message,
      nextAttemptAt: this.nextAttemptAt,
      everObtained: this.everObtained,
    };
  }

  // ---------------------------------------------------------------------------------------

  private ensureRefreshing(reason: string): void {
    if (this.loop || this.stopped) return;
    this.deps.logger.debug({ client: this.client.id, reason }, 'token refresh started');
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      // A caller may have arrived with a stricter need while the loop was finishing.
      if (this.waiters.size > 0 && !this.stopped && !this.permanentError)
        this.ensureRefreshing('pending');
    });
  }

  private async runLoop(): Promise<void> {
    let waits = 0;
    while (!this.stopped) {
      let delay: number;
      try {
        const attempt = await this.attempt();
        if (attempt.kind === 'token') {
          this.adopt(attempt.record, attempt.fetched);
          this.failures = 0;
          this.lastError = undefined;
          this.permanentError = undefined;
          this.nextAttemptAt = undefined;
          return;
        }
        // Another replica holds the lock: wait for its pub/sub message, re-read regardless.
        delay = Math.min(100 * 2 ** waits++, 1000);
      } catch (err) {
        delay = this.onAttemptFailed(err);
      }
      // Shutting down: no further attempt (stop() is waiting for this loop to end).
      if (this.stopped) return;
      this.nextAttemptAt = this.now() + delay;
      await this.sleep(delay);
    }
  }

  /** One pass: L2, lock, L2 again, provider, fenced write. */
  private async attempt(): Promise<Attempt> {
    const store = this.deps.store;
    const id = this.client.id;
    try {
      if (this.l1 && this.isGoodEnough(this.l1))
        return { kind: 'token', record: this.l1, fetched: false };
      const found = await this.readStore();
      this.storeFailingSince = undefined;
      if (found && this.isGoodEnough(found)) {
        this.countRefresh('adopted');
        return { kind: 'token', record: found, fetched: false };
      }
      const lock = await store.tryLock(id);
      if (!lock) {
        this.deps.metrics.lockAttempts.labels(id, 'held_elsewhere').inc();
        return { kind: 'wait' };
      }
      this.deps.metrics.lockAttempts.labels(id, 'acquired').inc();
      try {
        // Inside the lock, re-read: the previous holder may have written just now.
        const again = await this.readStore();
        if (again && this.isGoodEnough(again)) {
          this.countRefresh('adopted');
          return { kind: 'token', record: again, fetched: false };
        }
        if (this.l1 && this.isGoodEnough(this.l1)) {
          return { kind: 'token', record: this.l1, fetched: false };
        }
        const record = await this.fetch();
        await this.publish(record);
        return { kind: 'token', record, fetched: true };
      } finally {
        await lock.release();
      }
    } catch (err) {
      if (!(err instanceof TokenStoreException)) throw err;
      this.noteStoreFailure(err);
      this.deps.metrics.lockAttempts.labels(id, 'error').inc();
      // One slow or failed command is not an outage: under CPU pressure a reply can miss the
      // command timeout while Redis is fine. Fetching at once would make this replica refresh
      // beside the fleet's lock holder, so retry through the store until it has failed for
      // `storeGraceMs`, or the token we serve is about to run out.
      const now = this.now();
      this.storeFailingSince ??= now;
      const withinGrace = now - this.storeFailingSince < this.deps.storeGraceMs;
      const tokenLasts =
        this.l1 === undefined || this.l1.expiresAt - now > 2 * this.deps.storeGraceMs;
      if (withinGrace && tokenLasts) return { kind: 'wait' };
      // Degraded: this replica refreshes on its own; the loop is the per-replica single flight.
      const record = await this.fetch();
      this.needsResync = true;
      return { kind: 'token', record, fetched: true };
    }
  }

  private async readStore(): Promise<TokenRecord | undefined> {
    const stored = await this.deps.store.read(this.client.id);
    if (stored.status === 'corrupt') {
      this.deps.logger.warn(
        { client: this.client.id },
        'shared token value is unreadable (wrong key, tampered or foreign); discarding it and refreshing',
      );
      await this.deps.store.discardCorrupt(this.client.id);
      return undefined;
    }
    this.deps.metrics.cacheLookups
      .labels(this.client.id, 'l2', stored.status === 'found' ? 'hit' : 'miss')
      .inc();
    return stored.status === 'found' ? stored.record : undefined;
  }

  /** Write the new token to L2; if a newer one is already there, the next read adopts it. */
  private async publish(record: TokenRecord): Promise<void> {
    try {
      const written = await this.deps.store.writeFenced(this.client.id, record);
      if (!written) {
        this.deps.logger.info(
          { client: this.client.id },
          'a newer token was already stored; the fence kept it',
        );
      }
    } catch (err) {
      this.noteStoreFailure(err);
      this.needsResync = true;
    }
  }

  /** Accept a stored token only if it is newer than ours, not itself due, and meets waiters. */
  /**
   * Whether `r` ends the refresh: outside its refresh window and enough for every waiter.
   * Judged by the token alone, not by "is it the one we hold": another path (a pub/sub wake-up,
   * a resync) may have adopted the fleet's new token while this pass was in flight, and the
   * pass must then stop instead of fetching one more.
   */
  private isGoodEnough(r: TokenRecord): boolean {
    if (isDue(this.refreshAheadMs, r.obtainedAt, r.expiresAt, this.now())) return false;
    for (const w of this.waiters) if (r.expiresAt < w.needUntil) return false;
    return true;
  }

  private async fetch(): Promise<TokenRecord> {
    const credentials = await this.currentCredentials();
    const started = this.now();
    try {
      const grant = await this.deps.grantor.requestToken(this.client, credentials);
      this.observe(started, '2xx');
      this.countRefresh('fetched');
      this.deps.logger.info(
        {
          client: this.client.id,
          fingerprint: toRecord(grant).fingerprint,
          lifetimeSeconds: grant.lifetimeSeconds,
        },
        'new token obtained from the provider',
      );
      return toRecord(grant);
    } catch (err) {
      const status = err instanceof ProviderException ? err.details.status : undefined;
      this.observe(started, status === undefined ? 'none' : `${Math.floor(status / 100)}xx`);
      if (err instanceof ProviderException && err.code === ProviderErrorCode.InvalidClient) {
        // Rotation: the secret may have changed since we read it. Re-read once per failure.
        const fresh = await this.currentCredentials(true);
        if (
          fresh.clientId !== credentials.clientId ||
          fresh.clientSecret !== credentials.clientSecret
        ) {
          this.deps.logger.info(
            { client: this.client.id },
            'credentials changed; retrying with the new ones',
          );
          const grant = await this.deps.grantor.requestToken(this.client, fresh);
          this.countRefresh('fetched');
          return toRecord(grant);
        }
      }
      throw err;
    }
  }

  private async currentCredentials(force = false): Promise<ClientCredentials> {
    const maxAge = this.deps.settings.credentialsReloadSeconds * 1000;
    if (!force && this.credentials && this.now() - this.credentialsLoadedAt < maxAge) {
      return this.credentials;
    }
    try {
      this.credentials = await this.deps.loadCredentials(this.client);
      this.credentialsLoadedAt = this.now();
    } catch (err) {
      // Keep using the last good credentials through a Secrets Manager blip.
      if (this.credentials && err instanceof SecretsException && err.transient)
        return this.credentials;
      throw err;
    }
    return this.credentials;
  }

  /**
   * Makes `record` the L1 token (unless ours is newer), re-arms the refresh timer and answers
   * waiters. After a fresh fetch, a waiter the new token still cannot satisfy (it asked for
   * more than the provider's lifetime) is refused rather than made to trigger another fetch.
   */
  private adopt(record: TokenRecord, fetched = false): void {
    const cur = this.l1;
    if (!cur || record.expiresAt > cur.expiresAt || record.fingerprint !== cur.fingerprint) {
      if (!cur || record.expiresAt >= cur.expiresAt) this.l1 = record;
    }
    const held = this.l1!;
    this.everObtained = true;
    this.lifetimeMs = held.expiresAt - held.obtainedAt;
    this.remainingGauge.set(Math.max(0, (held.expiresAt - this.now()) / 1000));
    this.deps.metrics.lastRefreshSuccess.labels(this.client.id).set(this.now() / 1000);
    this.schedule(held);
    for (const w of this.waiters) {
      if (held.expiresAt >= w.needUntil) {
        clearTimeout(w.timer);
        this.waiters.delete(w);
        w.resolve(held);
      } else if (fetched) {
        clearTimeout(w.timer);
        this.waiters.delete(w);
        w.reject(this.lifetimeTooShort(held.expiresAt - held.obtainedAt));
      }
    }
  }

  private async adoptFromStore(): Promise<void> {
    try {
      const r = await this.readStore();
      if (r && (!this.l1 || r.expiresAt > this.l1.expiresAt)) this.adopt(r);
    } catch (err) {
      this.noteStoreFailure(err);
    }
  }

  private schedule(record: TokenRecord): void {
    clearTimeout(this.refreshTimer);
    const at = refreshAt(this.refreshAheadMs, record.obtainedAt, record.expiresAt, this.random);
    this.refreshTimer = setTimeout(
      () => this.ensureRefreshing('scheduled'),
      Math.max(0, at - this.now()),
    );
    this.refreshTimer.unref();
  }

  /** Records a failed pass and returns how long to wait before the next one. */
  private onAttemptFailed(err: unknown): number {
    this.failures++;
    this.lastError = err instanceof Error ? err : new Error(String(err));
    const permanent = this.classify(err);
    this.countRefresh(
      permanent
        ? err instanceof SecretsException
          ? 'credentials_error'
          : 'permanent_error'
        : 'transient_error',
    );
    const valid = this.l1 && this.l1.expiresAt > this.now() ? this.l1 : undefined;
    const logFields = {
      client: this.client.id,
      attempt: this.failures,
      code: (err as { code?: string }).code,
      err: this.lastError.message,
      servingUntil: valid ? new Date(valid.expiresAt).toISOString() : undefined,
    };
    if (permanent) {
      this.permanentError = permanent;
      this.deps.logger.error(logFields, `token refresh failed permanently: ${permanent.message}`);
      for (const w of this.waiters) {
        clearTimeout(w.timer);
        w.reject(permanent);
      }
      this.waiters.clear();
    } else {
      this.deps.logger.warn(logFields, 'token refresh failed; will retry');
    }
    const retryAfterMs = err instanceof ProviderException ? err.details.retryAfterMs : undefined;
    return retryDelayMs({
      attempt: this.failures,
      baseMs: this.deps.settings.backoffBaseMs,
      // An operator has to act on a permanent failure: probe slowly until they do.
      maxMs: this.deps.settings.backoffMaxMs,
      now: this.now(),
      expiresAt: permanent ? undefined : valid?.expiresAt,
      retryAfterMs: permanent ? this.deps.settings.backoffMaxMs : retryAfterMs,
      random: this.random,
    });
  }

  /** A permanent failure as the caller-facing exception, or undefined when transient. */
  private classify(err: unknown): TokenException | undefined {
    if (err instanceof ProviderException && !err.transient) {
      const rejected = err.code === ProviderErrorCode.InvalidClient;
      const source = this.client.credentials;
      return new TokenException(
        rejected ? TokenErrorCode.CredentialsRejected : TokenErrorCode.Unavailable,
        // Say where the refused credentials came from (a reference, never the value): that is
        // what the operator has to fix; they were already re-read once.
        rejected
          ? `${err.message}; they were read from ${source.file !== undefined ? `file "${source.file}"` : `Secrets Manager secret "${source.secretId}"`}`
          : err.message,
        Math.ceil(this.deps.settings.backoffMaxMs / 1000),
        { cause: err },
      );
    }
    if (err instanceof SecretsException && !err.transient) {
      return new TokenException(
        TokenErrorCode.CredentialsUnavailable,
        `cannot load the credentials for client "${this.client.id}": ${err.message}`,
        Math.ceil(this.deps.settings.backoffMaxMs / 1000),
        { cause: err },
      );
    }
    return undefined;
  }

  private lifetimeTooShort(lifetimeMs: number): TokenException {
    return new TokenException(
      TokenErrorCode.Unavailable,
      `client "${this.client.id}": the provider's tokens live ${Math.round(lifetimeMs / 1000)} s, less than the requested min_ttl`,
    );
  }

  private unavailableError(): TokenException {
    if (this.permanentError) return this.permanentError;
    const retryAfter =
      this.nextAttemptAt !== undefined
        ? Math.max(1, Math.ceil((this.nextAttemptAt - this.now()) / 1000))
        : 1;
    const why = this.lastError ? ` (last error: ${this.lastError.message})` : '';
    return new TokenException(
      TokenErrorCode.Unavailable,
      `no token with the requested remaining lifetime could be obtained in time for client "${this.client.id}"${why}`,
      retryAfter,
    );
  }

  private noteStoreFailure(err: unknown): void {
    if (!(err instanceof TokenStoreException)) throw err;
    this.deps.logger.warn({ client: this.client.id, err: err.message }, 'shared store unavailable');
  }

  private countRefresh(result: RefreshResult): void {
    this.deps.metrics.refreshes.labels(this.client.id, result).inc();
  }

  private observe(startedAt: number, statusClass: string): void {
    this.deps.metrics.providerLatency
      .labels('token', statusClass)
      .observe((this.now() - startedAt) / 1000);
  }

  /** Sleeps for `ms`, or less if a store event or shutdown wakes the loop. */
  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const wake = () => done();
      this.wake = wake;
      function done() {
        clearTimeout(timer);
        resolve();
      }
    });
  }
}
