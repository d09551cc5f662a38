import { hash } from 'node:crypto';
import { errors, jwtVerify, type JWTPayload, type JWTVerifyGetKey } from 'jose';
import {
  DEFAULT_CALLER_SCOPES,
  SERVICE_ACCOUNT_SUBJECT,
  type SubjectGrant,
} from '../config/caller-auth.schema';
import { bearerCredential, MAX_CREDENTIAL_LENGTH, unauthenticated } from './bearer-credential';
import type { Caller, CallerAuthenticator } from './caller';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';
import { grantedCaller } from './caller-authorization';
import { VerifiedTokenCache } from './verified-token.cache';

/** Kubernetes signs service-account tokens with RSA or ECDSA keys; nothing else is accepted. */
export const SERVICE_ACCOUNT_ALGORITHMS = ['RS256', 'ES256'];

export interface KubernetesAuthOptions {
  /** The required `iss`. */
  issuer: string;
  /** The required `aud` (the projected volume's `audience`). */
  audience: string;
  /** Service-account subject to the client ids it may use (`"*"`: all) and its scopes. */
  subjects: Readonly<Record<string, SubjectGrant>>;
  /** Resolves the signing key by `kid` (the cluster's JWKS). */
  getKey: JWTVerifyGetKey;
  /** Most verified tokens kept. */
  cacheSize: number;
  /** Leeway for `exp`/`nbf`. */
  clockToleranceSeconds: number;
  /** Longest `exp` - `iat` accepted. */
  maxTokenLifetimeSeconds: number;
}

/**
 * Caller authentication mode `kubernetes`: the caller sends its projected service-account
 * token; the broker verifies signature (cluster JWKS), issuer, audience and expiry, and maps
 * the subject `system:serviceaccount:<namespace>:<name>` to the clients it may use.
 *
 * A verified token is cached by its SHA-256 until it expires, so a caller's repeat requests
 * are answered synchronously. Concurrent first requests with one token share one verification.
 * Verification cannot see a deleted pod (only a TokenReview could); the token's own short
 * expiry bounds that, as it does for every other consumer of service-account JWTs.
 */
/** A verified service account nobody granted: no client, so every route answers 403 on the client. */
const NO_GRANT: SubjectGrant = { clients: [], scopes: [...DEFAULT_CALLER_SCOPES] };

export class KubernetesAuthenticator implements CallerAuthenticator {
  private readonly cache: VerifiedTokenCache<Caller>;
  private readonly inflight = new Map<string, Promise<Caller>>();
  private readonly callers = new Map<string, Caller>();

  constructor(private readonly options: KubernetesAuthOptions) {
    this.cache = new VerifiedTokenCache(options.cacheSize);
    for (const [subject, grant] of Object.entries(options.subjects)) {
      this.callers.set(subject, grantedCaller(subject, grant));
    }
  }

  authenticate(authorization: string | undefined): Caller | Promise<Caller> {
    // Fast path for the exact form every client sends: the cache holds hashes of tokens that
    // verified, so a hit needs no parsing (a regex over a ~1 KiB token costs more than the hash).
    const now = Date.now();
    let raw: string | undefined;
    let rawId: string | undefined;
    if (authorization?.startsWith('Bearer ') && authorization.length <= MAX_CREDENTIAL_LENGTH) {
      raw = authorization.slice(7);
      rawId = hash('sha256', raw, 'binary');
      const cached = this.cache.get(rawId, now);
      if (cached !== undefined) return cached;
    }
    const token = bearerCredential(authorization);
    const id = token === raw ? rawId! : hash('sha256', token, 'binary');
    const cached = token === raw ? undefined : this.cache.get(id, now);
    if (cached !== undefined) return cached;
    let pending = this.inflight.get(id);
    if (pending === undefined) {
      pending = this.verify(token, id).finally(() => this.inflight.delete(id));
      this.inflight.set(id, pending);
    }
    return pending;
  }

  private async verify(token: string, id: string): Promise<Caller> {
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, this.options.getKey, {
        issuer: this.options.issuer,
        audience: this.options.audience,
        algorithms: SERVICE_ACCOUNT_ALGORITHMS,
        requiredClaims: ['exp', 'iat', 'sub'],
        clockTolerance: this.options.clockToleranceSeconds,
      }));
    } catch (err) {
      throw rejection(err);
    }
    // A verified token is cached until `exp`, so its lifetime bounds how long a leaked token
    // keeps working here: a long-lived one (a legacy Secret token) is refused outright.
    const lifetime = payload.exp! - payload.iat!;
    if (lifetime > this.options.maxTokenLifetimeSeconds) {
      throw unauthenticated(
        `service-account token rejected: its lifetime (exp - iat) is ${lifetime} s, over the ${this.options.maxTokenLifetimeSeconds} s accepted (CALLER_AUTH_MAX_TOKEN_LIFETIME_SECONDS); use a projected token with a shorter expirationSeconds`,
      );
    }
    const subject = payload.sub!;
    if (!SERVICE_ACCOUNT_SUBJECT.test(subject)) {
      throw unauthenticated(
        'the token is not a Kubernetes service-account token (its subject is not system:serviceaccount:<namespace>:<name>)',
      );
    }
    // A verified but ungranted service account is a known caller: 403 names it, and the
    // answer is cached like any other so it cannot be used to make the broker verify again.
    const caller = this.callers.get(subject) ?? grantedCaller(subject, NO_GRANT);
    this.cache.set(id, caller, payload.exp! * 1000);
    return caller;
  }
}

/** jose's verdict as a 401 (or 503 when the keys are unreachable), saying what to fix. */
function rejection(err: unknown): CallerAuthException {
  // The key resolver's own verdict (`remoteServiceAccountKeys`), passed through by jose.
  if (err instanceof CallerAuthException && err.code === CallerAuthErrorCode.Unavailable) {
    return new CallerAuthException(
      CallerAuthErrorCode.Unavailable,
      'the cluster signing keys (JWKS) cannot be fetched right now, so the service-account token cannot be checked; retry shortly',
      { cause: err },
    );
  }
  let why: string;
  if (err instanceof errors.JWTExpired) {
    why = 'it has expired; read the projected token file again instead of keeping the token';
  } else if (err instanceof errors.JWTClaimValidationFailed) {
    why = `its "${err.claim}" claim is not accepted (${err.reason}); check the projected volume's audience and the cluster issuer`;
  } else if (err instanceof errors.JOSEAlgNotAllowed) {
    why = `its algorithm is not accepted (${SERVICE_ACCOUNT_ALGORITHMS.join(' or ')} only)`;
  } else if (err instanceof errors.JWKSNoMatchingKey) {
    why = 'it is signed with a key the cluster does not publish';
  } else if (err instanceof errors.JWSSignatureVerificationFailed) {
    why = 'its signature does not verify';
  } else {
    why = 'it is not a well-formed signed JWT';
  }
  return unauthenticated(`service-account token rejected: ${why}`, err);
}
