import { hostname } from 'node:os';
import type { TokenRecord } from './token-record';

/**
 * What another replica (or this one) did to a client's shared token. An update names the new
 * token by fingerprint, not by expiry: replicas' clocks differ, so a time would not compare.
 */
export type TokenStoreEvent =
  | { type: 'updated'; clientId: string; fingerprint: string }
  | { type: 'invalidated'; clientId: string; fingerprint: string }
  /**
   * An operator revoked the client's token: the generation is now `generation`, and no token
   * of an older generation may be served or written again. `fingerprint`: the token dropped.
   */
  | { type: 'revoked'; clientId: string; generation: number; fingerprint?: string };

/** This replica's name in the fleet (lock holder, revocation acknowledgements): pod name and pid. */
export const REPLICA_ID = `${hostname()}:${process.pid}`;

/** What {@link FleetBus.revoke} did. */
export interface Revocation {
  /** The client's generation after the revoke. */
  generation: number;
  /** The stored token it dropped, if one was stored. */
  fingerprint?: string;
  /** How many replicas the notification reached (Redis subscribers; this one included). */
  delivered: number;
}

/** Who holds a client's refresh lock, for the admin status. */
export interface LockState {
  held: boolean;
  /** {@link REPLICA_ID} of the holder, when known. */
  holder?: string;
  /** Ms left of its lease. */
  ttlMs?: number;
}

/** The store as the admin status shows it: never an address with a password. */
export interface StoreTopology {
  kind: 'redis' | 'memory';
  mode?: string;
  /** Host:port of the nodes or sentinels given (scheme and host only for a URL). */
  nodes?: string[];
  state: 'up' | 'down' | 'misconfigured';
}

/**
 * The fleet's refresh floor: `ms` before it lets the fleet ask the provider for a new token (0:
 * now), and the lifetime of the token that started it, so every replica learns the provider's
 * lifetime, even from a grant too short-lived to be stored.
 */
export interface RefreshHold {
  ms: number;
  lifetimeMs?: number;
}

/** What {@link RefreshLock.withRefreshLock} did: ran the function under the lock, or not. */
export type Locked<T> = { acquired: true; value: T } | { acquired: false };

/** The result of reading the shared token. */
export type StoredToken =
  | { status: 'found'; record: TokenRecord }
  | { status: 'absent' }
  /** Present but unusable (undecryptable, foreign, garbled): the caller should refresh. */
  | { status: 'corrupt' };

/**
 * What {@link StoreHealth.checkContinuity} found:
 * - `first`: this replica's first look (nothing to compare with yet);
 * - `kept`: the store still holds everything this replica saw in it;
 * - `lost`: the marker this replica saw is gone: the store was emptied (restarted without
 *   persistence, flushed, or a failover to a node that never had the data);
 * - `rolled_back`: the marker is older than one this replica already saw: a failover to a
 *   replica that missed the latest writes.
 */
export type StoreContinuity = 'first' | 'kept' | 'lost' | 'rolled_back';

/**
 * The shared token records (L2) and their events. Every method of the store's ports may throw
 * {@link TokenStoreException} `Unavailable`; callers then fall back to per-replica behaviour.
 */
export interface TokenRecords {
  read(clientId: string): Promise<StoredToken>;
  /**
   * Fenced compare-and-set: stores `record` only if it expires later than the stored token (or
   * the stored one was invalidated before `record` was requested). Returns whether it stored.
   */
  writeFenced(clientId: string, record: TokenRecord): Promise<boolean>;
  /**
   * Marks the stored token invalid only if it is still the one with `fingerprint`. Returns
   * whether this call invalidated it (false: already invalidated or replaced).
   */
  invalidate(clientId: string, fingerprint: string): Promise<boolean>;
  /** Drops a corrupt value so a fresh token can be written. */
  discardCorrupt(clientId: string): Promise<void>;
  /** Receives updates/invalidations/revocations from every replica (and this one). */
  onEvent(listener: (event: TokenStoreEvent) => void): void;
}

/**
 * The fleet refresh lock, and what its holder decides under it: the fleet's backoff after a
 * failure and its refresh floor after a grant.
 */
export interface RefreshLock {
  /**
   * Tries once to take the client's refresh lock and runs `fn` while holding it (the lease is
   * extended while `fn` runs, released after): `{ acquired: false }` at once when another
   * holder has it. What `fn` throws is rethrown once the lock is released.
   */
  withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>>;
  /** Who holds the refresh lock. */
  lockState(clientId: string): Promise<LockState>;
  /**
   * Defers the fleet's next provider request for this client by at least `delayMs` (after a
   * 429 or a failed refresh), so the whole fleet makes one attempt per window, not one per
   * replica. Only ever extends a deferral already set. Returns the ms now left.
   */
  deferRefresh(clientId: string, delayMs: number): Promise<number>;
  /** Ms before the fleet may next ask the provider for this client's token (0: now). */
  refreshDeferral(clientId: string): Promise<number>;
  /**
   * Starts the fleet's refresh floor after a token was granted: no replica asks the provider
   * for another for `intervalMs` (`TOKEN_MIN_REFRESH_INTERVAL_MS`). `invalidate` and
   * `discardCorrupt` lift it: the fleet then has no usable token and needs one now.
   */
  holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void>;
  /** What the refresh floor holds: see {@link RefreshHold}. */
  refreshHold(clientId: string): Promise<RefreshHold>;
}

/** The fleet bus: revocations and their acknowledgements, and reload requests. */
export interface FleetBus {
  /**
   * Fleet-wide revoke: bumps the client's generation, drops the stored token (it stays as a
   * fence: the very same token can never be written back, nor one of an older generation), lifts
   * the refresh floor and notifies every replica.
   */
  revoke(clientId: string): Promise<Revocation>;
  /**
   * The last generation this replica saw for `clientId` (0 before any revoke): learnt from every
   * read, every refused write and every revoke notification. Synchronous (no I/O).
   */
  generation(clientId: string): number;
  /** Records that this replica dropped the tokens older than `generation`. */
  acknowledgeRevocation(clientId: string, generation: number): Promise<void>;
  /** How many replicas acknowledged `generation`. */
  revocationAcks(clientId: string, generation: number): Promise<number>;
  /**
   * Asks every replica to re-read client credentials and caller grants now (an operator's
   * `POST /admin/reload`). Returns how many replicas the request reached (Redis subscribers,
   * this one included; 0 without a shared store). Throws `TokenStoreException` when down.
   */
  requestReload(): Promise<number>;
  /** Receives those requests, with the {@link REPLICA_ID} of the replica that made them. */
  onReloadRequested(listener: (from: string) => void): void;
}

/** The store's health, topology and continuity. */
export interface StoreHealth {
  readonly kind: 'redis' | 'memory';
  /** Whether the last interaction with the store succeeded. */
  readonly healthy: boolean;
  /**
   * Set while the store refuses the broker's configuration (credentials, ACL, TLS trust): a
   * setting to fix, which fails readiness, unlike an outage. Names the cause, never a secret.
   */
  readonly configurationError?: string;
  /** Mode, nodes and state, for the admin status. */
  topology(): StoreTopology;
  /**
   * Whether the store still holds the data this replica saw in it: each call advances a marker
   * that never expires and compares it with the last one this replica saw. Redis that lost its
   * data also lost the idempotency records, so repeats of answered orders could be sent again.
   */
  checkContinuity(clientId: string): Promise<StoreContinuity>;
  /** Called when the store becomes reachable again after an outage. */
  onRecovered(listener: () => void): void;
  /**
   * Resolves once the store answers, or after `timeoutMs` (then the broker starts degraded).
   * Starting the fleet before Redis answers would make every replica fetch its own token.
   */
  waitUntilReady(timeoutMs: number): Promise<boolean>;
  close(): Promise<void>;
}

/** The shared (L2) store: Redis across replicas, or process memory for a single replica. */
export type TokenStore = TokenRecords & RefreshLock & FleetBus & StoreHealth;

export const TOKEN_STORE = 'TOKEN_BROKER:TOKEN_STORE';
