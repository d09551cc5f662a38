import type { TokenCipher } from './token-cipher';

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
