import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/**
 * Longest credential accepted. A projected service-account token is about 1 KiB; anything
 * far larger is refused before it is hashed or parsed.
 */
export const MAX_CREDENTIAL_LENGTH = 8192;

/** RFC 6750 `b64token`. Linear-time: the character classes do not overlap. */
const BEARER = /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i;

/**
 * The credential of an `Authorization: Bearer <credential>` header. Throws 401 for anything
 * else: absent, another scheme, empty, oversized or with characters a bearer token cannot have.
 */
export function bearerCredential(authorization: string | undefined): string {
  if (authorization === undefined || authorization === '') {
    throw unauthenticated(
      'send "Authorization: Bearer <credential>" with your API key or service-account token',
    );
  }
  const match = authorization.length <= MAX_CREDENTIAL_LENGTH + 16 && BEARER.exec(authorization);
  if (!match) {
    throw unauthenticated(
      'the Authorization header must be "Bearer <credential>" with your API key or service-account token',
    );
  }
  return match[1];
}

export function unauthenticated(message: string, cause?: unknown): CallerAuthException {
  return new CallerAuthException(
    CallerAuthErrorCode.Unauthenticated,
    message,
    cause === undefined ? undefined : { cause },
  );
}
