/**
 * The client id, the store's clear fields and the revocation generation are bound to the sealed
 * value: one copied between clients, edited or put back after a revoke is refused.
 */
export interface TokenCipher {
  /** False without a cache key: nothing to sign with. */
  readonly authenticates: boolean;
  seal(clientId: string, accessToken: string, context?: string, generation?: number): string;
  /** Throws on a wrong key, tampering, or another client's, context or generation. */
  open(clientId: string, sealed: string, context?: string, generation?: number): string;
  /** Without a cache key, the bytes as they are, as tokens are then kept in clear. */
  sealBytes(context: readonly string[], bytes: Buffer): Buffer;
  openBytes(context: readonly string[], sealed: Buffer): Buffer;
  mac(parts: readonly (string | Buffer)[]): string;
  verifyMac(parts: readonly (string | Buffer)[], tag: string): boolean;
}

export const TOKEN_CIPHER = 'TOKEN_BROKER:TOKEN_CIPHER';

/** Only without a cache encryption key; the broker warns at start-up. */
export class PlainTokenCipher implements TokenCipher {
  /** Without a key nothing can be authenticated: anyone who can write Redis can forge. */
  readonly authenticates = false;

  seal(_clientId: string, accessToken: string): string {
    return `plain:${accessToken}`;
  }

  open(_clientId: string, sealed: string): string {
    if (!sealed.startsWith('plain:')) throw new Error('not a plain value');
    return sealed.slice('plain:'.length);
  }

  sealBytes(_context: readonly string[], bytes: Buffer): Buffer {
    return bytes;
  }

  openBytes(_context: readonly string[], sealed: Buffer): Buffer {
    return sealed;
  }

  mac(): string {
    return 'none';
  }

  verifyMac(): boolean {
    return true;
  }
}
