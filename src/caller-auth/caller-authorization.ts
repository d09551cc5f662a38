import type { CallerScope, SubjectGrant } from '../config/caller-auth.schema';
import { CLIENT_ID_PATTERN, describeForwardRules, ruleAllows } from '../config/client.schema';
import type { Caller } from './caller';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/**
 * How a message names a client id: quoted only when it could be one. Caller input of any other
 * length or content (an access token pasted into the wrong parameter) is never echoed.
 */
export function namedClient(clientId: string): string {
  return CLIENT_ID_PATTERN.test(clientId) ? `"${clientId}"` : 'with the requested id';
}

/** Configured or not. */
export function mayUse(caller: Caller, clientId: string): boolean {
  return caller.clients === '*' || caller.clients.has(clientId);
}

/**
 * The same answer whether the client is configured or not, so a caller cannot learn which
 * clients exist; a granted but unconfigured client still answers 404 (nothing is revealed).
 */
export function assertMayUse(caller: Caller, clientId: string, configured = true): void {
  if (mayUse(caller, clientId)) return;
  throw new CallerAuthException(
    CallerAuthErrorCode.Forbidden,
    `caller "${caller.name}" may not use client ${namedClient(clientId)}; ask the platform team to grant it`,
    { audit: configured ? { client: clientId } : { reason: 'unknown_client' } },
  );
}

/** A `"*"` among the clients grants them all. */
export function grantedCaller(name: string, grant: SubjectGrant): Caller {
  const clients = grant.clients.includes('*') ? '*' : new Set(grant.clients);
  const { forwardAllow } = grant;
  return { name, clients, scopes: new Set(grant.scopes), ...(forwardAllow && { forwardAllow }) };
}

/**
 * The caller's own allow-list, checked after the client's. `call` is the method and checked
 * path as the refusal names them; the caller is told its own rules, nothing of others'.
 */
export function assertMayForward(caller: Caller, method: string, path: string, call: string): void {
  const rules = caller.forwardAllow;
  if (rules === undefined || rules.some((r) => ruleAllows(r, method, path))) return;
  throw new CallerAuthException(
    CallerAuthErrorCode.Forbidden,
    `caller "${caller.name}" may not forward ${call}: its grant allows only ${describeForwardRules(rules)}. The platform team opens it with a rule in this caller's forwardAllow (callerAuth.apiKeys[].forwardAllow, or callerAuth.kubernetes.subjects.<subject>.forwardAllow)`,
    { audit: { reason: 'caller_forward_allow' } },
  );
}

const SCOPE_ACTION: Record<CallerScope, string> = {
  token: 'read the provider token (scope "token")',
  forward: 'have provider calls forwarded (scope "forward")',
  admin: 'use the admin routes (scope "admin")',
};

/** Checked before the client is resolved, so a caller without the scope learns nothing more. */
export function assertScope(caller: Caller, scope: CallerScope): void {
  if (caller.scopes.has(scope)) return;
  throw new CallerAuthException(
    CallerAuthErrorCode.Forbidden,
    `caller "${caller.name}" may not ${SCOPE_ACTION[scope]}; ask the platform team to grant it`,
    { audit: { reason: `missing_scope_${scope}` } },
  );
}
