/** Request ids: the caller's `X-Request-Id` when it looks sane, else a fresh one. */
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** The request id for a request carrying `given` as its `X-Request-Id` header. */
export function requestIdFrom(given: string | string[] | undefined): string {
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : crypto.randomUUID();
}
