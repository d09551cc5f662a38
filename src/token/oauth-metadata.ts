/** A Host fit to be echoed into the metadata document. */
const HOST = /^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$/;

/** Else the origin the caller used; an odd Host falls back to the listener's address. */
export function issuerFor(
  http: { issuer?: string | undefined; host: string; port: number },
  req: { protocol: string; host?: string | undefined },
): string {
  if (http.issuer !== undefined) return http.issuer;
  const given = req.host ?? '';
  const host = HOST.test(given) ? given : `${http.host}:${http.port}`;
  return `${req.protocol}://${host}`;
}
