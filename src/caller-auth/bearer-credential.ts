import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/** A projected service-account token is about 1 KiB; far larger is refused before hashing. */
export const MAX_CREDENTIAL_LENGTH = 8192;

/**
 * Node keeps only the first of repeated `Authorization` headers and a proxy may pick another:
 * the request is ambiguous, so it is refused (401).
 */
export const REPEATED_AUTHORIZATION = '\u0000repeated Authorization';

/** `rawHeaders` shows every line; one pass over a handful of names is cheap enough. */
export function authorizationOf(req: {
  readonly headers: { readonly authorization?: string };
  readonly rawHeaders: readonly string[];
}): string | undefined {
  const value = req.headers.authorization;
  if (value === undefined) return undefined;
  const raw = req.rawHeaders;
  let seen = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    if (name.length === 13 && name.toLowerCase() === 'authorization' && ++seen > 1) {
      return REPEATED_AUTHORIZATION;
    }
  }
  return value;
}

/** RFC 6750 `b64token`. Linear-time: the character classes do not overlap. */
const BEARER = /^Bearer +([A-Za-z0-9\-._~+/]+=*) *$/i;

/** Throws 401 for anything but `Bearer <b64token>` of a sane length. */
export function bearerCredential(authorization: string | undefined): string {
  if (authorization === undefined || authorization === '') {
    throw unauthenticated(
      'send "Authorization: Bearer <credential>" with your API key or service-account token',
    );
  }
  if (authorization === REPEATED_AUTHORIZATION) {
    throw unauthenticated('send one Authorization header; this request has several');
  }
  if (authorization.length > MAX_CREDENTIAL_LENGTH + 16) {
    throw unauthenticated(
      `the Authorization header is longer than ${MAX_CREDENTIAL_LENGTH + 16} characters; no API key or service-account token is that long`,
    );
  }
  const match = BEARER.exec(authorization);
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
