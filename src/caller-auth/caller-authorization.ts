import type { Caller } from './caller';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/** Throws 403 unless `caller` may use `clientId`. */
export function assertMayUse(caller: Caller, clientId: string): void {
  if (caller.clients === '*' || caller.clients.has(clientId)) return;
  throw new CallerAuthException(
    CallerAuthErrorCode.Forbidden,
    `caller "${caller.name}" may not use client "${clientId}"; ask the platform team to grant it`,
  );
}

/** A configured grant (client ids, `"*"` for all) as a caller's permission set. */
export function grantedClients(clients: readonly string[]): ReadonlySet<string> | '*' {
  return clients.includes('*') ? '*' : new Set(clients);
}
