/** What readiness reads of one client (a `ClientTokenManager.status()`). */
export interface ClientState {
  client: string;
  hasToken: boolean;
  everObtained: boolean;
  permanentError?: unknown;
  lifetimeError?: string;
}

/**
 * Whether the replica can serve this client: it obtained a token and its tokens live long enough
 * to serve. A provider outage after that does not count (callers must keep reaching the replica
 * for the still-valid token, and every replica shares the provider), nor does a credential
 * refusal while a valid token is held.
 */
export function servable(c: ClientState): boolean {
  return (
    c.everObtained &&
    c.lifetimeError === undefined &&
    !(c.permanentError !== undefined && !c.hasToken)
  );
}

/**
 * A replica is ready when it can serve: every client of `required`, or without such a list at
 * least one client. A client without a token is the operator's to see (named in the admin
 * readiness details, `token_broker_client_unservable`, an alert), not a reason to take every pod
 * out of rotation and with it every merchant.
 */
export function replicaReady(
  clients: readonly ClientState[],
  required: readonly string[],
): boolean {
  if (required.length === 0) return clients.some(servable);
  const byId = new Map(clients.map((c) => [c.client, c]));
  return required.every((id) => {
    const c = byId.get(id);
    return c !== undefined && servable(c);
  });
}
