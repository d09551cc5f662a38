/**
 * Seals a token before it leaves the process for the shared store, and opens it on the way
 * back. The client id is bound to the sealed value so a value copied between clients' keys is
 * refused rather than served.
 */
export interface TokenCipher {
  seal(clientId: string, accessToken: string): string;
  /** Throws when the value cannot be opened (wrong key, tampered, another client's). */
  open(clientId: string, sealed: string): string;
}

export const TOKEN_CIPHER = 'TOKEN_BROKER:TOKEN_CIPHER';
