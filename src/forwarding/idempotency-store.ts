import { BrokerException } from '../errors/broker.exception';
import type { ForwardingProfile } from './forwarding.exception';

/** The route whose bounds a record counts against: `POST /orders` or the passthrough. */
export type IdempotencyRoute = ForwardingProfile;

export interface StoredResponse {
  readonly status: number;
  /** The only response header a replay repeats. */
  readonly contentType?: string;
  readonly body: Buffer;
}

/** Every state carries the body's hash, so a different body under the same key is recognised. */
export type IdempotencyRecord =
  /**
   * `leaseRemainingMs` is on the store's clock (Redis's, never a replica's); at 0 its holder is
   * presumed dead.
   */
  | { readonly state: 'in_flight'; readonly bodyHash: string; readonly leaseRemainingMs: number }
  | { readonly state: 'completed'; readonly bodyHash: string; readonly response: StoredResponse }
  /** Sent, but the answer never came. Repeats must not send it again. */
  | { readonly state: 'unknown'; readonly bodyHash: string };

/** Keys belong to the caller that sent them: another caller's identical key is another record. */
export interface IdempotencyRef {
  readonly clientId: string;
  readonly caller: string;
  /** The store never holds the key itself. */
  readonly keyHash: string;
}

export interface IdempotencyClaim {
  readonly bodyHash: string;
  /** Random per request: only the claimant may settle its claim. */
  readonly owner: string;
  /** A duration: the store sets the deadline on its own clock, so skewed replicas agree on it. */
  readonly leaseMs: number;
  /** Absent: the record counts against no bound. */
  readonly quota?: IdempotencyQuota;
}

/**
 * What one caller may keep per client in the store, per route. The bounds are checked and the
 * claim counted in one atomic step; an in-flight claim counts `reserveBytes` until it is settled
 * and then what its record holds.
 */
export interface IdempotencyQuota {
  /** Each route's records are counted apart. */
  readonly profile: IdempotencyRoute;
  /** Records at once, this one included; 0: no bound. */
  readonly maxRecords: number;
  /** Bytes at once ({@link storedBytes} of each record); 0: no bound. */
  readonly maxBytes: number;
  /** What an in-flight claim counts until its answer is known. */
  readonly reserveBytes: number;
  /** Named in the refusal. */
  readonly recordsSetting: string;
  readonly bytesSetting: string;
}

/** What a record counts besides its answer: its fields, MACs, keys and seal, rounded up. */
export const RECORD_OVERHEAD_BYTES = 512;

/** The bytes a settled record counts against its caller's {@link IdempotencyQuota.maxBytes}. */
export function storedBytes(settlement: Settlement): number {
  if (settlement.state !== 'completed') return RECORD_OVERHEAD_BYTES;
  const { body, contentType } = settlement.response;
  return RECORD_OVERHEAD_BYTES + body.length + Buffer.byteLength(contentType ?? '');
}

export type ClaimResult =
  | { readonly claimed: true }
  | { readonly claimed: false; readonly existing: IdempotencyRecord };

/**
 * What became of a claimed request. `released` is only for a request that certainly created
 * nothing, so the caller may retry with the key; it never deletes a settled record.
 */
export type Settlement =
  | { readonly state: 'completed'; readonly response: StoredResponse }
  | { readonly state: 'unknown' | 'released' };

/**
 * Settling only acts on a record the same `owner` still holds, so a claimant that outlived its
 * lease cannot overwrite someone else's record.
 */
export interface IdempotencyStore {
  /**
   * Exactly one of any number of concurrent claims wins. A record written before records were
   * per caller is returned only to a claim with the same body hash: only an exact repeat can be
   * the retry of a request it recorded. Such records are gone one TTL after the upgrade.
   */
  claim(ref: IdempotencyRef, claim: IdempotencyClaim, ttlMs: number): Promise<ClaimResult>;
  /**
   * A completed or unknown record is kept `ttlMs` from now. `quota`: the route whose bound the
   * claim was counted against, whose count is corrected to what the record stores.
   */
  settle(
    ref: IdempotencyRef,
    owner: string,
    settlement: Settlement,
    ttlMs: number,
    quota?: IdempotencyRoute,
  ): Promise<boolean>;
  close(): Promise<void>;
}

export enum IdempotencyStoreErrorCode {
  Unavailable = 'idempotency_store_unavailable',
  /** A record this version cannot read. */
  Corrupt = 'idempotency_store_corrupt',
  /** Fails its MAC: written by something other than a broker. */
  Tampered = 'idempotency_record_tampered',
  CallerLimit = 'idempotency_caller_limit',
  CallerBytes = 'idempotency_caller_bytes',
}

export function callerLimit(
  ref: IdempotencyRef,
  quota: IdempotencyQuota,
  retryAfterMs: number,
): IdempotencyStoreException {
  return new IdempotencyStoreException(
    IdempotencyStoreErrorCode.CallerLimit,
    `caller "${ref.caller}" holds ${quota.maxRecords} Idempotency-Key records for client "${ref.clientId}", the most it may (${quota.recordsSetting})`,
    { retryAfterSeconds: Math.max(1, Math.ceil(retryAfterMs / 1000)) },
  );
}

export function callerBytes(
  ref: IdempotencyRef,
  quota: IdempotencyQuota,
  retryAfterMs: number,
): IdempotencyStoreException {
  return new IdempotencyStoreException(
    IdempotencyStoreErrorCode.CallerBytes,
    `caller "${ref.caller}" holds Idempotency-Key records for client "${ref.clientId}" of ${quota.maxBytes} bytes or more, the most it may (${quota.bytesSetting})`,
    { retryAfterSeconds: Math.max(1, Math.ceil(retryAfterMs / 1000)) },
  );
}

export class IdempotencyStoreException extends BrokerException<IdempotencyStoreErrorCode> {}
