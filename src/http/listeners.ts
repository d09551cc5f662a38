/**
 * The connections the admin listener accepted. Which listener a request arrived on is a fact
 * of its connection, so every decision about admin-only routes and answers keys on it, never on
 * how the request target is spelled or which local port a socket reports.
 */
const adminConnections = new WeakSet<object>();

/** Records a connection the admin listener accepted. */
export function markAdminConnection(socket: object): void {
  adminConnections.add(socket);
}

/** Whether the request on `socket` arrived on the admin listener. */
export function arrivedOnAdminListener(socket: object): boolean {
  return adminConnections.has(socket);
}
