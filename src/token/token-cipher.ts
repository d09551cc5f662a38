/**
 * Seals a token before it leaves the process for the shared store, and opens it on the way
 * back. The client id, the `context` the store keeps in clear next to the value (its
 * fingerprint, lifetime and expiry) and the client's revocation generation are bound to the
 * sealed value: a value copied between clients' keys, whose clear fields were edited, or put
 * back after a revoke, is refused rather than served.
 *
 * The same key authenticates what the idempotency store replays ({@link mac}).
 */
export interface TokenCipher {
  /** Whether {@link mac} proves anything (false without a cache key: nothing to sign with). */
  readonly authenticates: boolean;
  /** `generation`: the client's revocation generation the value belongs to (absent: 0). */
  seal(clientId: string, accessToken: string, context?: string, generation?: number): string;
  /**
   * Throws when the value cannot be opened (wrong key, tampered, another client's, context or
   * generation).
   */
  open(clientId: string, sealed: string, context?: string, generation?: number): string;
  /**
   * Seals bytes other than a token (a stored provider answer) with the same key; `context`
   * (what the value belongs to) is authenticated with it. Without a cache key: the bytes as
   * they are, as tokens are then kept in clear.
   */
  sealBytes(context: readonly string[], bytes: Buffer): Buffer;
  /** Opens {@link sealBytes}'s value; throws when it fails (wrong key, tampered, other context). */
  openBytes(context: readonly string[], sealed: Buffer): Buffer;
  /** An authentication tag over `parts`, to store next to them. */
  mac(parts: readonly (string | Buffer)[]): string;
  /** Whether `tag` is {@link mac}'s tag for `parts`. */
  verifyMac(parts: readonly (string | Buffer)[], tag: string): boolean;
}

export const TOKEN_CIPHER = 'TOKEN_BROKER:TOKEN_CIPHER';
