/**
 * Which listener a request arrived on is a fact of its connection: admin-only decisions key on
 * it, never on how the target is spelled or which local port a socket reports.
 */
const adminConnections = new WeakSet<object>();

export function markAdminConnection(socket: object): void {
  adminConnections.add(socket);
}

export function arrivedOnAdminListener(socket: object): boolean {
  return adminConnections.has(socket);
}
