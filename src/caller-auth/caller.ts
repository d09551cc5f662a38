import type { CallerScope } from '../config/caller-auth.schema';

/** An authenticated caller (a merchant service), the clients it may use and what it may do. */
export interface Caller {
  /** Stable name for logs and audit: an API key's name or a service account subject. */
  readonly name: string;
  /** Client ids this caller may use; `'*'` allows every configured client. */
  readonly clients: ReadonlySet<string> | '*';
  /** What it may do with them: read the token, have calls forwarded, administer (see `CALLER_SCOPES`). */
  readonly scopes: ReadonlySet<CallerScope>;
}

/**
 * Authenticates a request's `Authorization` header. Returns synchronously when the answer is
 * cached (the `GET /token` hot path must not allocate a promise per request), a promise when it
 * has to verify. Throws/rejects with a `CallerAuthException`.
 */
export interface CallerAuthenticator {
  authenticate(authorization: string | undefined): Caller | Promise<Caller>;
  /** Stops background work (key reloads); called on shutdown. */
  close?(): void;
  /**
   * Re-reads the grants from their source now (the admin reload), answering which callers were
   * added or removed (names only). Absent: nothing to re-read in this mode.
   */
  reloadNow?(): Promise<{ added: string[]; removed: string[] }>;
}

export const CALLER_AUTHENTICATOR = 'TOKEN_BROKER:CALLER_AUTHENTICATOR';

/**
 * Resolves a request's `?client=` (absent: the sole configured client) to a configured client
 * id `caller` may use, or throws the token domain's 400/404 problem or the 403 `forbidden` one
 * (for a client outside the grant, configured or not). Provided by the token module, so caller
 * admission uses the token route's own resolution without depending on the token folder.
 */
export type ClientResolver = (requested: string | undefined, caller: Caller) => string;

export const CLIENT_RESOLVER = 'TOKEN_BROKER:CLIENT_RESOLVER';
