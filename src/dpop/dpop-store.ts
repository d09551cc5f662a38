/**
 * A client's DPoP key is unusable. `permanent`: it stays so until an operator acts (a bad key, no
 * cache encryption key); otherwise a later attempt may succeed (a store or secret read failed).
 */
export class DpopKeyError extends Error {
  override readonly name = 'DpopKeyError';
  readonly permanent: boolean;

  constructor(message: string, options: { permanent: boolean; cause?: unknown }) {
    super(message, { cause: options.cause });
    this.permanent = options.permanent;
  }
}

/** Whose nonce: the authorization server's (token requests) or the API's (forwarded calls). */
export type NonceServer = 'as' | 'rs';

/**
 * What the fleet shares for DPoP, implemented over Redis (`src/redis/dpop-store.redis.ts`) or,
 * without one, in this process.
 */
export interface DpopStore {
  /**
   * The client's generated proof key (a private JWK): the stored one, else `generate()`'s,
   * stored unless another replica stored one first (first writer wins), and then the one
   * stored: every replica signs with the same key, and a restart keeps it.
   */
  claimKey(clientId: string, generate: () => string): Promise<string>;
  /** The server's last `DPoP-Nonce` for this client, if learnt and not expired. */
  nonce(clientId: string, server: NonceServer, origin: string): Promise<string | undefined>;
  learnNonce(clientId: string, server: NonceServer, origin: string, nonce: string): Promise<void>;
}

export const DPOP_STORE = 'TOKEN_BROKER:DPOP_STORE';

/** How long a learnt nonce is shared: servers rotate theirs within minutes (RFC 9449 §8). */
export const NONCE_TTL_MS = 120_000;

/** One process only: a generated key is lost on restart (the broker warns). */
export class MemoryDpopStore implements DpopStore {
  private readonly keys = new Map<string, string>();
  private readonly nonces = new Map<string, { nonce: string; until: number }>();

  constructor(private readonly now: () => number = Date.now) {}

  async claimKey(clientId: string, generate: () => string): Promise<string> {
    const stored = this.keys.get(clientId);
    if (stored !== undefined) return stored;
    const made = generate();
    this.keys.set(clientId, made);
    return made;
  }

  async nonce(clientId: string, server: NonceServer, origin: string) {
    const held = this.nonces.get(`${clientId} ${server} ${origin}`);
    return held !== undefined && held.until > this.now() ? held.nonce : undefined;
  }

  async learnNonce(clientId: string, server: NonceServer, origin: string, nonce: string) {
    this.nonces.set(`${clientId} ${server} ${origin}`, { nonce, until: this.now() + NONCE_TTL_MS });
  }
}
