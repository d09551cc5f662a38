import type { TokenRecord } from './token-record';

/**
 * Built by hand: `access_token` is a validated b64token, so needs no escaping. Built once per
 * second and shared by every response in it (never mutated).
 */
export function tokenBody(record: TokenRecord, now: number): Buffer {
  // Rounded down: a caller never believes in time it does not have.
  const expiresIn = Math.max(0, Math.floor((record.expiresAt - now) / 1000));
  if (lastBody.record !== record || lastBody.expiresIn !== expiresIn) {
    lastBody.record = record;
    lastBody.expiresIn = expiresIn;
    lastBody.bytes = Buffer.from(
      `{"access_token":"${record.accessToken}","token_type":"Bearer","expires_in":${expiresIn}` +
        `,"expires_at":"${new Date(record.expiresAt).toISOString()}"}`,
    );
  }
  return lastBody.bytes;
}

const lastBody: { record?: TokenRecord; expiresIn: number; bytes: Buffer } = {
  expiresIn: -1,
  bytes: Buffer.alloc(0),
};
