import { createRemoteJWKSet, errors, type JWTVerifyGetKey } from 'jose';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/** The signing keys could not be fetched (endpoint down, timeout, not a JWKS): not the caller's fault. */
function signingKeysUnavailable(cause: unknown): CallerAuthException {
  return new CallerAuthException(
    CallerAuthErrorCode.Unavailable,
    'the service-account signing keys (JWKS) could not be fetched',
    { cause },
  );
}

/** Errors that mean "this token names no key we trust", as opposed to "we cannot fetch keys". */
const TOKEN_FAULTS = [
  errors.JWKSNoMatchingKey,
  errors.JWKSMultipleMatchingKeys,
  errors.JOSENotSupported,
  errors.JOSEAlgNotAllowed,
  errors.JWKInvalid,
];

export interface ServiceAccountKeysOptions {
  /** Per fetch. @default 3000 */
  timeoutMs?: number;
  /** Least time between refetches triggered by unknown `kid`s (jose's cooldown). @default 30000 */
  cooldownMs?: number;
  /** Keys are refetched when older than this even without an unknown `kid`. @default 600000 */
  maxAgeMs?: number;
  /** After a failed fetch, no new fetch is attempted for this long. @default 2000 */
  failureBackoffMs?: number;
  /** Told about each failed fetch (to log it). */
  onFetchFailure?: (err: unknown) => void;
}

/** The cluster's service-account signing keys, from its JWKS endpoint. */
export interface ServiceAccountKeys {
  /**
   * Key resolver for `jwtVerify`. Throws a {@link CallerAuthException} coded
   * `caller_auth_unavailable` when the keys cannot be fetched.
   */
  readonly getKey: JWTVerifyGetKey;
  /** Fetches the keys now (start-up), so the first caller does not wait and a bad URL shows early. */
  warmUp(): Promise<void>;
}

/**
 * jose's remote JWKS caches the keys and refetches on an unknown `kid` at most once per
 * cooldown. What it does not limit is fetching while the endpoint is failing: every request
 * would retry. Here a failed fetch stops fetches for `failureBackoffMs`; meanwhile tokens
 * signed with an already known key still verify, and the others fail fast.
 */
export function remoteServiceAccountKeys(
  jwksUrl: string,
  options: ServiceAccountKeysOptions = {},
): ServiceAccountKeys {
  const jwks = createRemoteJWKSet(new URL(jwksUrl), {
    timeoutDuration: options.timeoutMs ?? 3000,
    cooldownDuration: options.cooldownMs ?? 30_000,
    cacheMaxAge: options.maxAgeMs ?? 600_000,
  });
  const backoffMs = options.failureBackoffMs ?? 2000;
  let failedUntil = 0;
  const knownKid = (kid: string | undefined) =>
    (jwks.jwks()?.keys ?? []).some((k) => kid === undefined || k.kid === kid);
  const failed = (cause: unknown): CallerAuthException => {
    failedUntil = Date.now() + backoffMs;
    options.onFetchFailure?.(cause);
    return signingKeysUnavailable(cause);
  };

  const getKey: JWTVerifyGetKey = async (header, token) => {
    if (Date.now() < failedUntil) {
      if (!jwks.fresh) throw signingKeysUnavailable('backing off');
      if (!knownKid(header.kid)) throw new errors.JWKSNoMatchingKey();
    }
    try {
      return await jwks(header, token);
    } catch (err) {
      if (TOKEN_FAULTS.some((fault) => err instanceof fault)) throw err;
      throw failed(err);
    }
  };
  return {
    getKey,
    warmUp: async () => {
      try {
        await jwks.reload();
      } catch (err) {
        throw failed(err);
      }
    },
  };
}
