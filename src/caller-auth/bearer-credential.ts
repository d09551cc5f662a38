import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/**
 * Longest credential accepted. A projected service-account token is about 1 KiB; anything
 * far larger is refused before it is hashed or parsed.
 */
export const MAX_CREDENTIAL_LENGTH = 8192;

/**
 * What {@link authorizationOf} gives for a request with more than one `Authorization` header.
 * Node keeps only the first, and a proxy in front may pick another: the request is ambiguous,
 * so it is refused (401) rather than authenticated with either.
 */
export const REPEATED_AUTHORIZATION = '\u0000repeated Authorization';

/**
 * The request's `Authorization` header, or {@link REPEATED_AUTHORIZATION} when it has several.
 * Node's `headers` keeps the first of repeated `Authorization` lines silently; `rawHeaders`
 * shows them all. Cheap enough for the hot path: one pass over a handful of names.
 */
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
  if (authorization === REPEATED_AUTHORIZATION) {
    throw unauthenticated('send one Authorization header; this request has several');
  }
  if (authorization.length > MAX_CREDENTIAL_LENGTH + 16) {
    throw unauthenticated(
      `the Authorization header is longer than ${MAX_CREDENTIAL_LENGTH + 16} characters; no API key or service-account token is that long`,
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
