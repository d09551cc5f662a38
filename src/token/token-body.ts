import { SECURITY_HEADERS } from '../http/security-headers';
import type { TokenRecord } from './token-record';

/** RFC 6749 §5.1: token answers are never cached. Shared by `GET /token` and OAuth answers. */
export const TOKEN_HEADERS: Readonly<Record<string, string>> = {
  'content-type': 'application/json; charset=utf-8',
  'cache-control': 'no-store',
  pragma: 'no-cache',
  ...SECURITY_HEADERS,
};

/**
 * Built by hand: `access_token` is a validated b64token, so needs no escaping. Built once per
 * second per token and shared by every response in it (never mutated); each client's token
 * keeps its own, so callers spread over many clients do not rebuild it per request.
 */
export function tokenBody(record: TokenRecord, now: number): Buffer {
  // Rounded down: a caller never believes in time it does not have.
  const expiresIn = Math.max(0, Math.floor((record.expiresAt - now) / 1000));
  const last = bodies.get(record);
  if (last !== undefined && last.expiresIn === expiresIn) return last.bytes;
  const bytes = Buffer.from(
    `{"access_token":"${record.accessToken}","token_type":"Bearer","expires_in":${expiresIn}` +
      `,"expires_at":"${new Date(record.expiresAt).toISOString()}"}`,
  );
  bodies.set(record, { expiresIn, bytes });
  return bytes;
}

/** Gone with the record it belongs to: a replaced token takes its body with it. */
const bodies = new WeakMap<TokenRecord, { expiresIn: number; bytes: Buffer }>();
