import { createHash } from 'node:crypto';

export interface TokenRecord {
  readonly accessToken: string;
  /** Epoch ms when the request was sent. */
  readonly obtainedAt: number;
  readonly expiresAt: number;
  /** Safe to log, compare and store in clear. */
  readonly fingerprint: string;
  /** The client's revocation generation when requested (absent: 0); older ones are never served. */
  readonly generation?: number;
  /** RFC 9449: `DPoP` when bound to the client's DPoP key; absent: a bearer token. */
  readonly tokenType?: 'DPoP';
}

/** 64 bits of SHA-256: plenty to tell one client's tokens apart, and reveals nothing. */
export function fingerprintOf(accessToken: string): string {
  return createHash('sha256').update(accessToken).digest('hex').slice(0, 16);
}

export function toRecord(
  grant: Pick<TokenRecord, 'accessToken' | 'obtainedAt' | 'expiresAt' | 'tokenType'>,
): TokenRecord {
  const { accessToken, obtainedAt, expiresAt, tokenType } = grant;
  const record = { accessToken, obtainedAt, expiresAt, fingerprint: fingerprintOf(accessToken) };
  return tokenType === undefined ? record : { ...record, tokenType };
}

/** Generation 0 (no revoke ever) is left out, the same as absent. */
export function withGeneration(record: TokenRecord, generation: number): TokenRecord {
  return generation > 0 ? { ...record, generation } : record;
}
