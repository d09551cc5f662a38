import {
  createRemoteJWKSet,
  customFetch,
  errors,
  type FetchImplementation,
  type JWTVerifyGetKey,
} from 'jose';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

/** Not the caller's fault. */
function signingKeysUnavailable(cause: unknown): CallerAuthException {
  return new CallerAuthException(
    CallerAuthErrorCode.Unavailable,
    'the service-account signing keys (JWKS) could not be fetched',
    { cause },
  );
}

/** "This token names no key we trust", as opposed to "we cannot fetch keys". */
const TOKEN_FAULTS = [
  errors.JWKSNoMatchingKey,
  errors.JWKSMultipleMatchingKeys,
  errors.JOSENotSupported,
  errors.JOSEAlgNotAllowed,
  errors.JWKInvalid,
];

interface ServiceAccountKeysOptions {
  /** @default 3000 */
  timeoutMs?: number;
  /** Between refetches for unknown `kid`s. @default 30000 */
  cooldownMs?: number;
  /** No fetch for this long after a failure. @default 2000 */
  failureBackoffMs?: number;
  onFetchFailure?: (err: unknown) => void;
}

interface ServiceAccountKeys {
  /** Throws `caller_auth_unavailable` when the keys cannot be fetched. */
  readonly getKey: JWTVerifyGetKey;
  /** So the first caller does not wait and a bad URL shows early. */
  warmUp(): Promise<void>;
}

/**
 * jose does not limit fetching while the endpoint fails, so every request would retry: here a
 * failure stops fetches for `failureBackoffMs`; tokens of known keys still verify meanwhile.
 */
export function remoteServiceAccountKeys(
  jwksUrl: string,
  options: ServiceAccountKeysOptions = {},
): ServiceAccountKeys {
  const jwks = createRemoteJWKSet(new URL(jwksUrl), {
    timeoutDuration: options.timeoutMs ?? 3000,
    cooldownDuration: options.cooldownMs ?? 30_000,
    // Refetched when older, even without an unknown `kid`.
    cacheMaxAge: 600_000,
    [customFetch]: boundedJwksFetch(1_048_576, 100),
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
    warmUp: () =>
      jwks.reload().catch((err: unknown) => {
        throw failed(err);
      }),
  };
}

/**
 * jose reads the answer whole, and any caller can make it refetch (an unknown `kid`): a huge or
 * endless one would exhaust memory, and each key is tried against tokens naming no known `kid`.
 */
function boundedJwksFetch(maxBytes: number, maxKeys: number): FetchImplementation {
  const refused = (why: string) =>
    new CallerAuthException(
      CallerAuthErrorCode.Unavailable,
      `the JWKS answer is refused: ${why}; check that callerAuth.kubernetes.jwksUrl (CALLER_AUTH_JWKS_URL) points at the cluster's service-account JWKS`,
    );
  return async (url, init) => {
    const response = await fetch(url, init);
    if (response.status !== 200 || response.body === null) return response;
    if (Number(response.headers.get('content-length') ?? 0) > maxBytes) {
      await response.body.cancel();
      throw refused(`it is larger than ${maxBytes} bytes`);
    }
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    const chunks: Uint8Array[] = [];
    let size = 0;
    for (let read = await reader.read(); !read.done; read = await reader.read()) {
      size += read.value.byteLength;
      if (size > maxBytes) {
        await reader.cancel();
        throw refused(`it is larger than ${maxBytes} bytes`);
      }
      chunks.push(read.value);
    }
    const body = Buffer.concat(chunks);
    let keys: unknown;
    try {
      keys = (JSON.parse(body.toString('utf8')) as { keys?: unknown } | null)?.keys;
    } catch {
      return new Response(body, { status: 200 });
    }
    if (Array.isArray(keys) && keys.length > maxKeys) {
      throw refused(`it lists ${keys.length} keys, more than the ${maxKeys} accepted`);
    }
    return new Response(body, { status: 200 });
  };
}
