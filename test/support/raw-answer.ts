/** An HTTP answer as received: status, headers as Node parsed them, the body's bytes. */
export interface RawAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

/**
 * What must match when two fronts answer the same request (the parity specs): everything but
 * the date.
 */
export function comparable(a: RawAnswer) {
  const headers = { ...a.headers };
  delete headers.date;
  return { status: a.status, headers, body: a.body.toString('latin1') };
}
