import { ProviderErrorCode, ProviderException } from './provider.exception';

export interface GrantedToken {
  readonly accessToken: string;
  /** When the request was *sent*: the lifetime counts from here, never from receipt. */
  readonly obtainedAt: number;
  readonly expiresAt: number;
  /** Seconds: the provider's `expires_in`, or the default. */
  readonly lifetimeSeconds: number;
}

/** A larger `expires_in` is capped: refreshing early is safe. */
export const MAX_LIFETIME_SECONDS = 86_400;
const MAX_TOKEN_LENGTH = 8192;
/** RFC 6750 b64token: always safe in an Authorization header. */
const B64TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/;

/**
 * Lenient in what it accepts (only `access_token` is certain), strict in what it passes on;
 * messages describe the body's shape, never its content.
 */
export function parseTokenResponse(
  body: string,
  sentAt: number,
  defaultLifetimeSeconds: number,
): GrantedToken {
  const trimmed = body.trimStart();
  if (trimmed === '') throw malformed('the body is empty');
  if (trimmed.startsWith('<')) throw malformed('the body is an HTML/XML page, not JSON');
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    throw malformed('the body is not valid JSON');
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw malformed('the body is not a JSON object');
  }
  const fields = json as Record<string, unknown>;

  const token = fields.access_token;
  if (typeof token !== 'string' || token.length === 0) {
    throw malformed('"access_token" is missing or not a non-empty string');
  }
  if (token.length > MAX_TOKEN_LENGTH)
    throw malformed(`"access_token" exceeds ${MAX_TOKEN_LENGTH} characters`);
  if (!B64TOKEN.test(token))
    throw malformed('"access_token" contains characters not allowed in a bearer token');

  const type = fields.token_type;
  if (
    type !== undefined &&
    type !== null &&
    (typeof type !== 'string' || type.toLowerCase() !== 'bearer')
  ) {
    throw malformed('"token_type" is present but not "Bearer"');
  }

  const lifetimeSeconds = parseExpiresIn(fields.expires_in, defaultLifetimeSeconds);
  return {
    accessToken: token,
    obtainedAt: sentAt,
    expiresAt: sentAt + lifetimeSeconds * 1000,
    lifetimeSeconds,
  };
}

function parseExpiresIn(value: unknown, defaultLifetimeSeconds: number): number {
  if (value === undefined || value === null) return defaultLifetimeSeconds;
  const n =
    typeof value === 'number'
      ? value
      : typeof value === 'string' && /^\s*\d+(\.\d+)?\s*$/.test(value)
        ? Number(value)
        : NaN;
  if (!Number.isFinite(n)) throw malformed('"expires_in" is neither a number nor a numeric string');
  if (n < 1)
    throw malformed('"expires_in" is zero or negative: the token would already be expired');
  return Math.min(Math.floor(n), MAX_LIFETIME_SECONDS);
}

function malformed(what: string): ProviderException {
  return new ProviderException(
    ProviderErrorCode.MalformedResponse,
    `token endpoint answered 2xx but ${what}`,
  );
}
