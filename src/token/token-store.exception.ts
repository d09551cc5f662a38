export enum TokenStoreErrorCode {
  /** The shared store did not answer in time or is disconnected. */
  Unavailable = 'store_unavailable',
}

/** The shared token store failed; the token service degrades to per-replica behaviour. */
export class TokenStoreException extends Error {
  constructor(
    readonly code: TokenStoreErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'TokenStoreException';
  }
}
