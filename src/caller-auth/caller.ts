import type { CallerScope } from '../config/caller-auth.schema';
import type { ForwardRule } from '../config/client.schema';

export interface Caller {
  /** An API key's name or a service account subject. */
  readonly name: string;
  /** `'*'`: every configured client. */
  readonly clients: ReadonlySet<string> | '*';
  readonly scopes: ReadonlySet<CallerScope>;
  /** Its grant's narrowing of what may be forwarded; absent: the clients' allow-lists alone. */
  readonly forwardAllow?: readonly ForwardRule[];
}

/** Synchronous when cached: the `GET /token` hot path must not allocate a promise per request. */
export interface CallerAuthenticator {
  authenticate(authorization: string | undefined): Caller | Promise<Caller>;
  close?(): void;
  /** Absent: nothing to re-read in this mode. */
  reloadNow?(): Promise<CallerReload>;
}

/** By caller name: names are safe to log, keys and hashes are not. */
export interface CallerReload {
  added: string[];
  removed: string[];
}

export const CALLER_AUTHENTICATOR = 'TOKEN_BROKER:CALLER_AUTHENTICATOR';

/**
 * `?client=` (absent: the sole client) to a client id `caller` may use. The token module provides
 * it, so caller admission resolves like the token route without depending on the token folder.
 */
export type ClientResolver = (requested: string | undefined, caller: Caller) => string;

export const CLIENT_RESOLVER = 'TOKEN_BROKER:CLIENT_RESOLVER';
