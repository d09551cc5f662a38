import { ProviderErrorCode, ProviderException } from './provider.exception';

export interface GrantedToken {
  readonly accessToken: string;
  /** When the request was *sent*: the lifetime counts from here, never from receipt. */
  readonly obtainedAt: number;
  readonly expiresAt: number;
  /** Seconds: the provider's `expires_in`, or the default. */
  readonly lifetimeSeconds: number;
  /** RFC 9449 §5: a token bound to the client's DPoP key; absent: a bearer token. */
  readonly tokenType?: 'DPoP';
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
  const kind = typeof type === 'string' ? type.toLowerCase() : type;
  if (kind !== undefined && kind !== null && kind !== 'bearer' && kind !== 'dpop') {
    throw malformed('"token_type" is present but neither "Bearer" nor "DPoP"');
  }

  const lifetimeSeconds = parseExpiresIn(fields.expires_in, defaultLifetimeSeconds);
  return {
    accessToken: token,
    obtainedAt: sentAt,
    expiresAt: sentAt + lifetimeSeconds * 1000,
    lifetimeSeconds,
    ...(kind === 'dpop' && { tokenType: 'DPoP' as const }),
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

/** A non-2xx answer of the token endpoint; the body is never quoted. */
export function tokenErrorForStatus(
  what: string,
  status: number,
  body: string,
  retryAfter: string | string[] | undefined,
  check: string,
): ProviderException {
  const oauthError = readOAuthError(body);
  const suffix = oauthError ? ` (error "${oauthError}")` : '';
  // Only a server failure or a rate limit says when to try again.
  const fail = (code: ProviderErrorCode, message: string, retryable = false) =>
    new ProviderException(code, `${what}: ${message}`, {
      status,
      ...(retryable && { retryAfterMs: parseRetryAfter(retryAfter) }),
    });
  if (status === 401 || oauthError === 'invalid_client') {
    return fail(
      ProviderErrorCode.InvalidClient,
      `the provider refused the client credentials (HTTP ${status}${suffix}); check ${check}`,
    );
  }
  if (status === 429) {
    return fail(ProviderErrorCode.RateLimited, 'rate limited by the provider (HTTP 429)', true);
  }
  if (status >= 500) {
    return fail(
      ProviderErrorCode.ServerError,
      `the provider failed (HTTP ${status}${suffix})`,
      true,
    );
  }
  return fail(
    ProviderErrorCode.Rejected,
    `the provider rejected the request (HTTP ${status}${suffix})`,
  );
}

/** Seconds or an HTTP date, into milliseconds. */
function parseRetryAfter(value: string | string[] | undefined): number | undefined {
  const v = Array.isArray(value) ? value[0] : value;
  if (v === undefined) return undefined;
  if (/^\d+$/.test(v.trim())) return Number(v.trim()) * 1000;
  const date = Date.parse(v);
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now());
}

/** Only a plausible identifier, never free text. */
export function readOAuthError(body: string): string | undefined {
  try {
    const json = JSON.parse(body) as { error?: unknown };
    return typeof json.error === 'string' && /^[a-z_]{1,64}$/.test(json.error)
      ? json.error
      : undefined;
  } catch {
    return undefined;
  }
}
