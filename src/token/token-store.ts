import { hostname } from 'node:os';
import type { TokenRecord } from './token-record';

/** Names the new token by fingerprint, not expiry: replicas' clocks differ. */
export type TokenStoreEvent =
  | { type: 'updated' | 'invalidated'; clientId: string; fingerprint: string }
  /** No token of a generation older than `generation` may be served or written again. */
  | { type: 'revoked'; clientId: string; generation: number; fingerprint?: string };

/** This replica's name in the fleet (lock holder, acknowledgements): pod name and pid. */
export const REPLICA_ID = `${hostname()}:${process.pid}`;

export interface Revocation {
  generation: number;
  fingerprint?: string;
  /** Redis subscribers reached, this one included. */
  delivered: number;
}

export interface LockState {
  held: boolean;
  holder?: string;
  ttlMs?: number;
}

/** Never an address with a password. */
export interface StoreTopology {
  kind: 'redis' | 'memory';
  mode?: string;
  nodes?: string[];
  state: 'up' | 'down' | 'misconfigured';
}

/**
 * `ms` before the fleet may ask the provider again, and the lifetime of the grant that started
 * it, so every replica learns the provider's lifetime, even from a grant too short to store.
 */
export interface RefreshHold {
  ms: number;
  lifetimeMs?: number;
}

/** The bounds on what the provider's rejections may cost, and whose call saw the rejection. */
export interface RejectionRule {
  caller: string;
  /** After an invalidation, none for this long (`TOKEN_MIN_REJECTION_INTERVAL_MS`). */
  floorMs: number;
  /** Invalidations one caller may cause per window; 0: no bound. */
  perCaller: number;
  windowMs: number;
}

/**
 * `invalidated`: a replacement is needed; `stale`: the token was already invalidated or replaced
 * (a retry with the current one is fine); `floored`, `caller_budget`: nothing was invalidated.
 */
export type RejectionVerdict = 'invalidated' | 'stale' | 'floored' | 'caller_budget';

/** What the fleet may send one token endpoint: at once and per second (0: no bound). */
export interface EndpointCap {
  concurrency: number;
  perSecond: number;
  /** How long a place is held if its holder dies without giving it back. */
  leaseMs: number;
}

/** A place among an endpoint's token requests, or when to ask again. */
export type EndpointSlot =
  | { granted: true; release(): Promise<void> }
  | { granted: false; retryInMs: number };

export type Locked<T> = { acquired: true; value: T } | { acquired: false };

export type StoredToken =
  | { status: 'found'; record: TokenRecord }
  | { status: 'absent' }
  /** Undecryptable, foreign or garbled: the caller should refresh. */
  | { status: 'corrupt' };

/**
 * `lost`: the marker this replica saw is gone (the store was emptied); `rolled_back`: it is older
 * than one already seen (a failover to a replica that missed the latest writes).
 */
export type StoreContinuity = 'first' | 'kept' | 'lost' | 'rolled_back';

export interface TokenRecords {
  read(clientId: string): Promise<StoredToken>;
  /**
   * {@link read} of every client of `clientIds` in a few round trips, not one each: how a replica
   * that joins adopts what the fleet already holds. Each client appears in the answer.
   */
  readMany(clientIds: readonly string[]): Promise<ReadonlyMap<string, StoredToken>>;
  /**
   * Stores `record` only if it expires later than the stored token, or the stored one was
   * invalidated before `record` was requested.
   */
  writeFenced(clientId: string, record: TokenRecord): Promise<boolean>;
  /**
   * Only if still the one with `fingerprint`: a storm of rejections costs one refresh. Never
   * lifts the refresh floor; holds a rejection floor of its own and counts the caller's budget.
   */
  invalidate(clientId: string, fingerprint: string, rule: RejectionRule): Promise<RejectionVerdict>;
  discardCorrupt(clientId: string): Promise<void>;
  /** Events from every replica, this one included. */
  onEvent(listener: (event: TokenStoreEvent) => void): void;
  /** From now on, events of exactly these clients (a reload added or removed some). */
  follow(clientIds: readonly string[]): Promise<void>;
}

export interface RefreshLock {
  /**
   * Tries once; the lease is extended while `fn` runs. What `fn` throws is rethrown once the
   * lock is released.
   */
  withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>>;
  lockState(clientId: string): Promise<LockState>;
  /** Only ever extends a deferral: the whole fleet makes one attempt per window. */
  deferRefresh(clientId: string, delayMs: number): Promise<number>;
  refreshDeferral(clientId: string): Promise<number>;
  /** `discardCorrupt` lifts the floor (the fleet then needs a token now); `invalidate` never does. */
  holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void>;
  refreshHold(clientId: string): Promise<RefreshHold>;
  /**
   * A place among the token requests the whole fleet sends `endpoint` (every client of one
   * authorization server shares it), within `cap`; given back with `release` once the request
   * ends, or by its lease.
   */
  takeEndpointSlot(endpoint: string, cap: EndpointCap): Promise<EndpointSlot>;
}

export interface FleetBus {
  /** The dropped token stays as a fence: neither it nor an older generation is written back. */
  revoke(clientId: string): Promise<Revocation>;
  /** Learnt from every read, refused write and notification. Synchronous (no I/O). */
  generation(clientId: string): number;
  acknowledgeRevocation(clientId: string, generation: number): Promise<void>;
  revocationAcks(clientId: string, generation: number): Promise<number>;
  /** Returns how many replicas the request reached (0 without a shared store). */
  requestReload(): Promise<number>;
  onReloadRequested(listener: (from: string) => void): void;
}

export interface StoreHealth {
  readonly kind: 'redis' | 'memory';
  readonly healthy: boolean;
  /** A setting the store refuses (credentials, ACL, TLS): fails readiness, unlike an outage. */
  readonly configurationError?: string;
  topology(): StoreTopology;
  /**
   * Redis that lost its data also lost the idempotency records, so repeats of answered orders
   * could be sent again.
   */
  checkContinuity(clientIds: readonly string[]): Promise<ReadonlyMap<string, StoreContinuity>>;
  onRecovered(listener: () => void): void;
  /** Starting before Redis answers would make every replica fetch its own token. */
  waitUntilReady(timeoutMs: number): Promise<boolean>;
  close(): Promise<void>;
}

/** One part per job. Every method of a part may throw {@link TokenStoreException} `Unavailable`. */
export interface TokenStore {
  readonly records: TokenRecords;
  readonly lock: RefreshLock;
  readonly bus: FleetBus;
  readonly health: StoreHealth;
}

export const TOKEN_STORE = 'TOKEN_BROKER:TOKEN_STORE';
