import { BrokerException } from '../errors/broker.exception';

/** The provider's answer as kept for replays: status, the headers replayed, and the exact bytes. */
export interface StoredResponse {
  readonly status: number;
  /** The provider's `Content-Type`, the only response header a replay repeats. */
  readonly contentType?: string;
  readonly body: Buffer;
}

/**
 * What is known about an `Idempotency-Key`. Every state carries the SHA-256 of the body first
 * sent with the key, so a different body under the same key is recognised in every state.
 */
export type IdempotencyRecord =
  /**
   * Claimed and being forwarded. `leaseRemainingMs` is what the claimant's lease has left, on
   * the store's clock (Redis's, never a replica's); at 0 its holder is presumed dead.
   */
  | { readonly state: 'in_flight'; readonly bodyHash: string; readonly leaseRemainingMs: number }
  /** The provider answered; repeats replay this. */
  | { readonly state: 'completed'; readonly bodyHash: string; readonly response: StoredResponse }
  /** Sent, but the answer never came: the order may exist. Repeats must not send it again. */
  | { readonly state: 'unknown'; readonly bodyHash: string };

/**
 * Which record: keys belong to the caller that sent them, so a record is found only by its
 * client, its caller and the key's hash (scoped by the use: orders hash the bare key, the
 * passthrough the method, path and key).
 */
export interface IdempotencyRef {
  readonly clientId: string;
  /** The caller's name (`Caller.name`): another caller's identical key is another record. */
  readonly caller: string;
  /** SHA-256 of the key as the use scopes it; the store never holds the key itself. */
  readonly keyHash: string;
}

/** A new claim: who holds it and for how long it is presumed alive. */
export interface IdempotencyClaim {
  readonly bodyHash: string;
  /** Random per request: only the claimant may settle its claim. */
  readonly owner: string;
  /**
   * How long (ms) the claimant is presumed alive. A duration, not a deadline: the store sets
   * the deadline on its own clock so replicas with skewed clocks agree on it.
   */
  readonly leaseMs: number;
  /**
   * Most records the caller may hold for the client at once, this one included; past it the
   * claim throws {@link IdempotencyStoreErrorCode.CallerLimit}. Absent or 0: no bound.
   */
  readonly maxPerCaller?: number;
}

export type ClaimResult =
  | { readonly claimed: true }
  | { readonly claimed: false; readonly existing: IdempotencyRecord };

/**
 * Where the outcome of each `Idempotency-Key` is kept: Redis across replicas, or process memory
 * for a single replica. Records are per client and caller ({@link IdempotencyRef}): one caller
 * can neither read nor squat another's keys.
 *
 * Settling (`complete`, `markUnknown`, `release`) only acts on a record the same `owner` still
 * holds, so a claimant that outlived its lease cannot overwrite someone else's record.
 *
 * Every method may throw {@link IdempotencyStoreException}.
 */
export interface IdempotencyStore {
  readonly kind: 'redis' | 'memory';
  /**
   * Atomically creates an `in_flight` record that lives `ttlMs`, unless one exists; then
   * returns the existing record instead. Exactly one of any number of concurrent claims wins.
   * A record written before records were per caller (no caller in its key) is returned too, but
   * only to a claim with the same body hash: it cannot tell its caller, and only an exact
   * repeat can be the retry of a request it recorded. Such records are never written again and
   * are gone one idempotency TTL after the upgrade.
   */
  claim(ref: IdempotencyRef, claim: IdempotencyClaim, ttlMs: number): Promise<ClaimResult>;
  /** Records the provider's answer for `ttlMs` from now. Returns whether it was recorded. */
  complete(
    ref: IdempotencyRef,
    owner: string,
    response: StoredResponse,
    ttlMs: number,
  ): Promise<boolean>;
  /** Records that the order may exist but its answer is lost, for `ttlMs` from now. */
  markUnknown(ref: IdempotencyRef, owner: string, ttlMs: number): Promise<boolean>;
  /**
   * Forgets an `in_flight` claim whose request certainly created nothing (never sent, or
   * refused by the provider before processing), so the caller may retry with the same key.
   */
  release(ref: IdempotencyRef, owner: string): Promise<boolean>;
  close(): Promise<void>;
}

export enum IdempotencyStoreErrorCode {
  /** The store did not answer in time or is disconnected. */
  Unavailable = 'idempotency_store_unavailable',
  /** The store holds a record this version cannot read. */
  Corrupt = 'idempotency_store_corrupt',
  /** The record fails its integrity check (MAC under the cache key): written by someone else. */
  Tampered = 'idempotency_record_tampered',
  /** The caller holds its most records for the client (`retryAfterSeconds`: until one expires). */
  CallerLimit = 'idempotency_caller_limit',
}

/** A caller at its bound of records: it may claim again once its oldest record expires. */
export function callerLimit(
  ref: IdempotencyRef,
  max: number,
  retryAfterMs: number,
): IdempotencyStoreException {
  return new IdempotencyStoreException(
    IdempotencyStoreErrorCode.CallerLimit,
    `caller "${ref.caller}" holds ${max} Idempotency-Key records for client "${ref.clientId}", the most it may`,
    { retryAfterSeconds: Math.max(1, Math.ceil(retryAfterMs / 1000)) },
  );
}

/** The idempotency store failed; translated by the adapter that met the library error. */
export class IdempotencyStoreException extends BrokerException<IdempotencyStoreErrorCode> {}
