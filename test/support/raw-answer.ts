/** An HTTP answer as received: status, headers as Node parsed them, the body's bytes. */
export interface RawAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

/** A problem body's request id: the broker's own, a fresh UUID for every request. */
const BROKER_REQUEST_ID =
  /"requestId":"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"/g;

/**
 * What must match when two fronts answer the same request (the parity specs): everything but
 * the date and the broker's id of the request in a problem body (replaced by a fixed id of the
 * same length, so `content-length` still matches the body).
 */
export function comparable(a: RawAnswer) {
  const headers = { ...a.headers };
  delete headers.date;
  const body = a.body
    .toString('latin1')
    .replace(BROKER_REQUEST_ID, '"requestId":"00000000-0000-4000-8000-000000000000"');
  return { status: a.status, headers, body };
}
