import type { TokenRecord } from './token-record';

/** What another replica (or this one) did to a client's shared token. */
export type TokenStoreEvent =
  | { type: 'updated'; clientId: string; expiresAt: number }
  | { type: 'invalidated'; clientId: string; fingerprint: string };

/** A held refresh lock. Releasing an already lost lock is harmless. */
export interface RefreshLock {
  release(): Promise<void>;
}

/** The result of reading the shared token. */
export type StoredToken =
  | { status: 'found'; record: TokenRecord }
  | { status: 'absent' }
  /** Present but unusable (undecryptable, foreign, garbled): the caller should refresh. */
  | { status: 'corrupt' };

/**
 * The shared (L2) token store: Redis across replicas, or process memory for a single replica.
 * Every method may throw {@link TokenStoreException} `Unavailable`; callers then fall back to
 * per-replica behaviour.
 */
export interface TokenStore {
  readonly kind: 'redis' | 'memory';
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
  /** Tries once to take the client's refresh lock; `null` when another holder has it. */
  tryLock(clientId: string): Promise<RefreshLock | null>;
  /** Receives updates/invalidations from every replica (and this one). */
  onEvent(listener: (event: TokenStoreEvent) => void): void;
  /** Called when the store becomes reachable again after an outage. */
  onRecovered(listener: () => void): void;
  /** Whether the last interaction with the store succeeded. */
  readonly healthy: boolean;
  /**
   * Resolves once the store answers, or after `timeoutMs` (then the broker starts degraded).
   * Starting the fleet before Redis answers would make every replica fetch its own token.
   */
  waitUntilReady(timeoutMs: number): Promise<boolean>;
  close(): Promise<void>;
}

export const TOKEN_STORE = 'TOKEN_BROKER:TOKEN_STORE';
