/** A Host header fit to be echoed into the metadata document. */
const HOST = /^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$/;

/**
 * The issuer the metadata names: the configured one, else the origin the caller used (a Host
 * that is not a plain host name and port falls back to the listener's address).
 */
export function issuerFor(
  http: { issuer?: string | undefined; host: string; port: number },
  req: { protocol: string; host?: string | undefined },
): string {
  if (http.issuer !== undefined) return http.issuer;
  const given = req.host ?? '';
  const host = HOST.test(given) ? given : `${http.host}:${http.port}`;
  return `${req.protocol}://${host}`;
}
