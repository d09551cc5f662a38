import type { CallerScope } from '../config/caller-auth.schema';
import type { Caller } from './caller';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/** What a configured client id looks like; anything else is not echoed back to the caller. */
export const CLIENT_ID_SHAPE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** Whether `caller`'s grant covers `clientId` (configured or not). */
export function mayUse(caller: Caller, clientId: string): boolean {
  return caller.clients === '*' || caller.clients.has(clientId);
}

/**
 * Throws 403 `forbidden` unless `caller` may use `clientId`.
 *
 * The answer is the same whether the client is configured or not (`configured` only reaches
 * the audit line): an authenticated caller must not learn which clients exist beyond its own
 * grant by comparing answers. 403 rather than 404 because that is what the caller can act on
 * (ask for a grant) and what the contract says for "not allowed"; a client inside the grant
 * that is not configured still answers 404 `unknown_client` (the grant names it, so nothing
 * is revealed, and it is a configuration mistake to fix).
 */
export function assertMayUse(caller: Caller, clientId: string, configured = true): void {
  if (mayUse(caller, clientId)) return;
  // Caller input of any length or content (an access token pasted into the wrong parameter)
  // must not come back in bodies or logs.
  const named = CLIENT_ID_SHAPE.test(clientId) ? `"${clientId}"` : 'with the requested id';
  throw new CallerAuthException(
    CallerAuthErrorCode.Forbidden,
    `caller "${caller.name}" may not use client ${named}; ask the platform team to grant it`,
    { audit: configured ? { client: clientId } : { reason: 'unknown_client' } },
  );
}

/** A configured grant (client ids, `"*"` for all) as a caller's permission set. */
export function grantedClients(clients: readonly string[]): ReadonlySet<string> | '*' {
  return clients.includes('*') ? '*' : new Set(clients);
}

/** A caller from its configured grant. */
export function grantedCaller(
  name: string,
  grant: { readonly clients: readonly string[]; readonly scopes: readonly CallerScope[] },
): Caller {
  return { name, clients: grantedClients(grant.clients), scopes: new Set(grant.scopes) };
}

/** What each scope lets a caller do, for the 403 that names the missing one. */
const SCOPE_ACTION: Record<CallerScope, string> = {
  token: 'read the provider token (scope "token")',
  forward: 'have provider calls forwarded (scope "forward")',
  admin: 'use the admin routes (scope "admin")',
};

/**
 * Throws 403 `forbidden` unless `caller` holds `scope`. Checked before the client is resolved,
 * so a caller without the scope learns nothing about clients either.
 */
export function assertScope(caller: Caller, scope: CallerScope): void {
  if (caller.scopes.has(scope)) return;
  throw new CallerAuthException(
    CallerAuthErrorCode.Forbidden,
    `caller "${caller.name}" may not ${SCOPE_ACTION[scope]}; ask the platform team to grant it`,
    { audit: { reason: `missing_scope_${scope}` } },
  );
}
