import { createHash } from 'node:crypto';

/** A token as the broker holds it in every layer (L1 memory, L2 store). */
export interface TokenRecord {
  readonly accessToken: string;
  /** Epoch ms when the request that produced it was sent. */
  readonly obtainedAt: number;
  /** Epoch ms after which it is never served. */
  readonly expiresAt: number;
  /** Non-reversible identifier, safe to log, compare and store in clear. */
  readonly fingerprint: string;
  /**
   * The client's revocation generation when the token was requested (absent: 0). A token of a
   * generation older than the fleet's is never served nor written (see `TokenStore.revoke`).
   */
  readonly generation?: number;
}

/**
 * A short, non-reversible identifier of a token: the first 16 hex digits of its SHA-256.
 * 64 bits are plenty to tell generations of one client's token apart and reveal nothing.
 */
export function fingerprintOf(accessToken: string): string {
  return createHash('sha256').update(accessToken).digest('hex').slice(0, 16);
}

export function toRecord(grant: {
  accessToken: string;
  obtainedAt: number;
  expiresAt: number;
}): TokenRecord {
  return {
    accessToken: grant.accessToken,
    obtainedAt: grant.obtainedAt,
    expiresAt: grant.expiresAt,
    fingerprint: fingerprintOf(grant.accessToken),
  };
}

/**
 * `record` stamped with revocation generation `generation`; generation 0 (no revoke ever) is
 * left out, the same as absent.
 */
export function withGeneration(record: TokenRecord, generation: number): TokenRecord {
  return generation > 0 ? { ...record, generation } : record;
}
