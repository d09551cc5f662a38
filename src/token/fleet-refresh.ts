import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { MetricsService } from '../metrics/metrics.service';
import type { GrantedToken } from '../provider/token-response.parser';
import { type TokenGrantor, tokenEndpointOf } from '../provider/auth-server.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import type { CredentialsCache } from '../secrets/credentials-cache';
import { isFleetWide } from './refresh-failure';
import { MIN_SERVE_MS } from './refresh-schedule';
import { type TokenRecord, toRecord, withGeneration } from './token-record';
import { type EndpointGate, EndpointGates, EndpointLimiter } from './endpoint-limiter';
import type {
  EndpointCap,
  EndpointSlot,
  FleetBus,
  Locked,
  RefreshLock,
  TokenRecords,
} from './token-store';
import { TokenStoreException } from './token-store.exception';
import { TokenErrorCode, TokenException } from './token.exception';

/**
 * A forced refresh adopts a token obtained up to this long before it was asked for, so operators
 * asking on every replica at once cost one provider request.
 */
export const FORCED_COALESCE_MS = 100;

const UNBOUNDED: EndpointSlot = { granted: true, release: () => Promise.resolve() };
/** The replica's own bound per endpoint while the store is down: one for all its clients. */
const SHARED_LOCAL_ENDPOINTS = new EndpointLimiter();

/** Shared by every client's pass: nothing in it is one client's. */
export interface FleetRefreshDeps {
  store: { records: TokenRecords; lock: RefreshLock; bus: Pick<FleetBus, 'generation'> };
  grantor: TokenGrantor;
  metrics: Pick<MetricsService, 'lockAttempts' | 'cacheLookups' | 'refreshes' | 'providerLatency'>;
  logger: Logger;
  /** How long the store must keep failing before this replica refreshes alone. */
  storeGraceMs: number;
  /** `minRefreshIntervalMs` (`TOKEN_MIN_REFRESH_INTERVAL_MS`): at most one grant per interval. */
  settings: { readonly minRefreshIntervalMs: number };
  /** The fleet's bound on requests to this client's token endpoint; absent: none. */
  endpointCap?: EndpointCap;
  /** This process's passes per token endpoint, shared by its clients; absent: this client's own. */
  gates?: EndpointGates;
  now?: () => number;
}

export interface RefreshContext {
  held(): TokenRecord | undefined;
  goodEnough(record: TokenRecord): boolean;
  /** Callers wait on this pass: it goes first through the endpoint's gate. */
  urgent?(): boolean;
  /**
   * Records a failed provider request and returns this replica's backoff, which the pass shares
   * with the fleet before releasing the lock. Without it the failure is thrown.
   */
  failed?(err: unknown): number;
}

export type RefreshPass =
  | {
      kind: 'token';
      record: TokenRecord;
      fetched: boolean;
      /** Not written to the store (it was down): push it once the store is back. */
      unshared: boolean;
    }
  | { kind: 'wait' }
  /** The fleet is backing off, or this pass's request failed; `retryInMs`: the next attempt. */
  | { kind: 'deferred' | 'failed'; retryInMs: number }
  /** A token was granted less than the refresh floor ago. */
  | { kind: 'floor'; retryInMs: number; lifetimeMs?: number }
  /** The provider granted a token too short-lived to serve; the floor started with it. */
  | { kind: 'unusable'; lifetimeMs: number; retryInMs: number };

/** The fleet's cap on the endpoint is full: ask again in `retryInMs`, in the same place. */
type Capped = { kind: 'capped'; retryInMs: number };

/**
 * The fleet refresh pass of one client. **The one place the refresh lock is taken.** If the
 * store is down longer than `storeGraceMs`, the replica asks the provider directly.
 */
export class FleetRefresh {
  private storeFailingSince?: number;
  /** This client's token endpoint, as the fleet's bound on it is keyed. */
  private readonly endpoint: string;
  /** This replica's own floor while the store (which holds the fleet's) is unreachable. */
  private lastGrantAt?: number;
  private readonly gate: EndpointGate;
  /** Ends a pass's wait for the endpoint; set only during one. */
  private interrupt?: () => void;
  private readonly now: () => number;

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: FleetRefreshDeps,
    private readonly credentials: CredentialsCache,
  ) {
    this.now = deps.now ?? Date.now;
    this.endpoint = tokenEndpointOf(client);
    this.gate = (deps.gates ?? new EndpointGates()).of(this.endpoint, deps.endpointCap);
  }

  /**
   * One pass, once the endpoint's gate lets it in. Turned away by the fleet's cap, it keeps its
   * place and asks again (its client's lock released meanwhile), so only the few passes inside ask
   * Redis while the rest wait in memory, in turn. `wait` if {@link stopWaiting} came first.
   */
  async run(ctx: RefreshContext): Promise<RefreshPass> {
    const held = ctx.held();
    if (held && ctx.goodEnough(held)) return token(held, false);
    const turn = this.gate.enter(() => ctx.urgent?.() ?? false);
    this.interrupt = turn.cancel;
    const entered = await turn.entered;
    try {
      for (;;) {
        this.interrupt = undefined;
        if (!entered) return { kind: 'wait' };
        const pass = await this.pass(ctx);
        if (pass.kind !== 'capped') return pass;
        if (!(await this.pause(pass.retryInMs))) return { kind: 'wait' };
      }
    } finally {
      this.interrupt = undefined;
      if (entered) this.gate.leave();
    }
  }

  /** Waiting for the endpoint (its turn at the gate, or the cap): nothing read meanwhile. */
  get waiting(): boolean {
    return this.interrupt !== undefined;
  }

  /** A pass waiting for the endpoint gives up (shutdown, the client removed). */
  stopWaiting(): void {
    this.interrupt?.();
  }

  /** False when interrupted. */
  private pause(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(true), ms);
      this.interrupt = () => {
        clearTimeout(timer);
        resolve(false);
      };
    });
  }

  private async pass(ctx: RefreshContext): Promise<RefreshPass | Capped> {
    try {
      const held = ctx.held();
      if (held && ctx.goodEnough(held)) return token(held, false);
      const found = await this.readShared();
      this.storeFailingSince = undefined;
      if (found && ctx.goodEnough(found)) return this.adopted(found);
      const locked = await this.locked(() => this.underLock(ctx));
      return locked.acquired ? locked.value : { kind: 'wait' };
    } catch (err) {
      noteStoreFailure(this.deps.logger, this.client.id, err);
      this.deps.metrics.lockAttempts.labels('error').inc();
      // One slow command is not an outage (under CPU pressure a reply can miss its timeout
      // while Redis is fine): fetching at once would refresh beside the fleet's lock holder.
      const now = this.now();
      this.storeFailingSince ??= now;
      const withinGrace = now - this.storeFailingSince < this.deps.storeGraceMs;
      const held = ctx.held();
      const tokenLasts = held === undefined || held.expiresAt - now > 2 * this.deps.storeGraceMs;
      if (withinGrace && tokenLasts) return { kind: 'wait' };
      const localHoldMs = this.localHoldMs();
      if (localHoldMs > 0) return { kind: 'floor', retryInMs: localHoldMs };
      const record = await this.fetch();
      this.lastGrantAt = this.now();
      return this.unusable(record) ?? token(record, true, true);
    }
  }

  private async underLock(ctx: RefreshContext): Promise<RefreshPass | Capped> {
    const { lock, records } = this.deps.store;
    const id = this.client.id;
    // Inside the lock, re-read: the previous holder may have written just now.
    const again = await this.readShared();
    if (again && ctx.goodEnough(again)) return this.adopted(again);
    const heldNow = ctx.held();
    if (heldNow && ctx.goodEnough(heldNow)) return token(heldNow, false);
    // The fleet backs off as one: after a 429 or a failure, the next request waits for the
    // shared deferral however many replicas want a token.
    const deferredMs = await lock.refreshDeferral(id);
    if (deferredMs > 0) return { kind: 'deferred', retryInMs: deferredMs };
    // The floor: whatever the lifetime or the callers' min_ttl, one grant per interval.
    const hold = await lock.refreshHold(id);
    if (hold.ms > 0) return { kind: 'floor', retryInMs: hold.ms, lifetimeMs: hold.lifetimeMs };
    // The fleet's bound on the authorization server, whichever clients and replicas ask it.
    const slot = await this.endpointSlot();
    if (!slot.granted) return { kind: 'capped', retryInMs: slot.retryInMs };
    let record: TokenRecord;
    try {
      record = await this.fetch().finally(() => void slot.release());
    } catch (err) {
      if (!ctx.failed) throw err;
      const delayMs = ctx.failed(err);
      // Shared before the lock is released, so the next holder already sees it.
      // Never shortens a longer deferral already set; without the store, this replica's own.
      const retryInMs = isFleetWide(err)
        ? Math.max(delayMs, await this.orIfStoreFails(lock.deferRefresh(id, delayMs), delayMs))
        : delayMs;
      return { kind: 'failed', retryInMs };
    }
    // Started before the lock is released, so the next holder already sees it.
    await this.holdFleet(record);
    const unusable = this.unusable(record);
    if (unusable) return unusable;
    // The fence keeps a newer stored token. Undefined: the store failed, push on recovery.
    const written = await this.orIfStoreFails(records.writeFenced(id, record), undefined);
    if (written === false) {
      this.deps.logger.info({ client: id }, 'a newer token was already stored; the fence kept it');
    }
    return token(record, true, written === undefined);
  }

  /**
   * A place among the endpoint's token requests. Without the store, this replica's own bound:
   * it then refreshes alone anyway. A full endpoint is asked again shortly, with jitter, so the
   * waiting clients do not come back as one.
   */
  private async endpointSlot(): Promise<EndpointSlot> {
    const cap = this.deps.endpointCap;
    if (cap === undefined || (cap.concurrency === 0 && cap.perSecond === 0)) return UNBOUNDED;
    const taken = this.deps.store.lock.takeEndpointSlot(this.endpoint, cap);
    const slot = await this.orIfStoreFails(taken, undefined);
    const found = slot ?? SHARED_LOCAL_ENDPOINTS.take(this.endpoint, cap);
    if (found.granted) return found;
    this.deps.metrics.refreshes.labels('endpoint_capped').inc();
    return { granted: false, retryInMs: found.retryInMs + 50 + Math.floor(Math.random() * 200) };
  }

  liftLocalFloor(): void {
    this.lastGrantAt = undefined;
  }

  private localHoldMs(): number {
    if (this.lastGrantAt === undefined) return 0;
    return Math.max(0, this.lastGrantAt + this.deps.settings.minRefreshIntervalMs - this.now());
  }

  /** Fleet-wide and here: the store may be down by the next pass. */
  private async holdFleet(record: TokenRecord): Promise<void> {
    this.lastGrantAt = this.now();
    const { store, settings } = this.deps;
    const lifetimeMs = record.expiresAt - record.obtainedAt;
    const hold = store.lock.holdRefreshes(
      this.client.id,
      settings.minRefreshIntervalMs,
      lifetimeMs,
    );
    await this.orIfStoreFails(hold, undefined);
  }

  /** Undefined when `record` is servable. */
  private unusable(record: TokenRecord): RefreshPass | undefined {
    if (record.expiresAt - this.now() >= MIN_SERVE_MS) return undefined;
    return {
      kind: 'unusable',
      lifetimeMs: record.expiresAt - record.obtainedAt,
      retryInMs: Math.max(1, this.localHoldMs()),
    };
  }

  /** A corrupt value is discarded so a fresh token can be written. */
  async readShared(): Promise<TokenRecord | undefined> {
    const { store, metrics, logger } = this.deps;
    const stored = await store.records.read(this.client.id);
    if (stored.status === 'corrupt') {
      logger.warn(
        { client: this.client.id },
        'shared token value is unreadable (wrong key, tampered or foreign); discarding it and refreshing',
      );
      await store.records.discardCorrupt(this.client.id);
      return undefined;
    }
    const found = stored.status === 'found' ? stored.record : undefined;
    metrics.cacheLookups.labels('l2', found ? 'hit' : 'miss').inc();
    return found;
  }

  /** `fallback` when the store fails (noted); any other error is rethrown. */
  orIfStoreFails<T>(op: Promise<T>, fallback: T): Promise<T> {
    return op.catch((err: unknown) => {
      noteStoreFailure(this.deps.logger, this.client.id, err);
      return fallback;
    });
  }

  /**
   * The operator's forced refresh: one provider request for the fleet under the lock, ignoring
   * the floor and backoff but starting the floor after; coalesced by {@link FORCED_COALESCE_MS}.
   */
  async forced(askedAt: number, waitMs: number): Promise<Forced> {
    const deadline = this.now() + waitMs;
    for (;;) {
      const locked = await this.locked(() => this.forcedUnderLock(askedAt));
      if (locked.acquired) return locked.value;
      if (this.now() >= deadline) {
        throw new TokenException(
          TokenErrorCode.Unavailable,
          `client "${this.client.id}": another replica held the refresh lock for the whole wait; retry the forced refresh in a few seconds`,
          { retryAfterSeconds: 2 },
        );
      }
      await sleep(50);
    }
  }

  /** Counted whether acquired or held elsewhere. */
  private async locked<T>(fn: () => Promise<T>): Promise<Locked<T>> {
    const attempts = this.deps.metrics.lockAttempts;
    const locked = await this.deps.store.lock.withRefreshLock(this.client.id, () => {
      attempts.labels('acquired').inc();
      return fn();
    });
    if (!locked.acquired) attempts.labels('held_elsewhere').inc();
    return locked;
  }

  private async forcedUnderLock(askedAt: number): Promise<Forced> {
    const found = await this.readShared();
    if (found && found.obtainedAt >= askedAt - FORCED_COALESCE_MS) {
      this.deps.metrics.refreshes.labels('adopted').inc();
      return { record: found, fetched: false, written: false };
    }
    const record = await this.fetch();
    await this.holdFleet(record);
    const written = await this.deps.store.records.writeFenced(this.client.id, record);
    return { record, fetched: true, written };
  }

  /**
   * After `invalid_client`, tries each other version of the credentials. Takes no lock: the caller
   * holds it, or the store is down and this is the replica's single flight.
   */
  private async fetch(): Promise<TokenRecord> {
    const { grantor, logger, metrics } = this.deps;
    const { credentials, now } = this;
    const client = this.client;
    const current = await credentials.get();
    const started = now();
    const observe = (statusClass: string) =>
      metrics.providerLatency.labels('token', statusClass).observe((now() - started) / 1000);
    // The generation it is requested in: a revoke arriving meanwhile fences it out.
    const generation = this.deps.store.bus.generation(client.id);
    const granted = (grant: GrantedToken) => {
      metrics.refreshes.labels('fetched').inc();
      return withGeneration(toRecord(grant), generation);
    };
    try {
      const grant = await grantor.requestToken(client, current);
      observe('2xx');
      const record = granted(grant);
      logger.info(
        {
          client: client.id,
          fingerprint: record.fingerprint,
          lifetimeSeconds: grant.lifetimeSeconds,
        },
        'new token obtained from the provider',
      );
      return record;
    } catch (err) {
      const status = err instanceof ProviderException ? err.details.status : undefined;
      observe(status === undefined ? 'none' : `${Math.floor(status / 100)}xx`);
      if (!isInvalidClient(err)) throw err;
      // The secret may have changed since read, or a rotation be half done.
      const rotated = await credentials.rotate(
        current,
        (fresh) => grantor.requestToken(client, fresh),
        isInvalidClient,
      );
      if (!rotated) throw err;
      logger.info(
        { client: client.id, stage: rotated.stage ?? 'current' },
        'credentials refused; the server accepted another version of them',
      );
      return granted(rotated.result);
    }
  }

  private adopted(record: TokenRecord): RefreshPass {
    this.deps.metrics.refreshes.labels('adopted').inc();
    return token(record, false);
  }
}

function isInvalidClient(err: unknown): err is ProviderException {
  return err instanceof ProviderException && err.code === ProviderErrorCode.InvalidClient;
}

/** A forced refresh's token; `written`: the fence let it into the store. */
export type Forced = { record: TokenRecord; fetched: boolean; written: boolean };

function token(record: TokenRecord, fetched: boolean, unshared = false): RefreshPass {
  return { kind: 'token', record, fetched, unshared };
}

/** Debug level: the store logs its own up/down transitions, and a line per command flooded. */
export function noteStoreFailure(logger: Logger, clientId: string, err: unknown): void {
  if (!(err instanceof TokenStoreException)) throw err;
  logger.debug({ client: clientId, err: err.message }, 'shared store unavailable');
}
