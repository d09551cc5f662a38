import { hash } from 'node:crypto';
import { errors, jwtVerify, type JWTPayload, type JWTVerifyGetKey } from 'jose';
import {
  type CallerAuthSettings,
  DEFAULT_CALLER_SCOPES,
  SERVICE_ACCOUNT_SUBJECT,
  type SubjectGrant,
} from '../config/caller-auth.schema';
import { bearerCredential, MAX_CREDENTIAL_LENGTH, unauthenticated } from './bearer-credential';
import type { Caller, CallerAuthenticator, CallerReload } from './caller';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';
import { grantedCaller } from './caller-authorization';
import { VerifiedTokenCache } from './verified-token.cache';

/** Kubernetes signs service-account tokens with RSA or ECDSA keys. */
export const SERVICE_ACCOUNT_ALGORITHMS = ['RS256', 'ES256'];

/** The settings, with the issuer required and the cluster's JWKS (by `kid`) to verify with. */
type KubernetesAuthOptions = Omit<CallerAuthSettings['kubernetes'], 'jwksUrl' | 'issuer'> & {
  issuer: string;
  getKey: JWTVerifyGetKey;
  /** The grants as a configuration reload left them; absent: the ones given stay. */
  currentSubjects?: () => Readonly<Record<string, SubjectGrant>>;
};

/** A verified service account nobody granted: every route answers 403 on the client. */
const NO_GRANT: SubjectGrant = { clients: [], scopes: [...DEFAULT_CALLER_SCOPES] };

/**
 * Verified tokens are cached by SHA-256 until they expire, so repeats are answered synchronously.
 * A deleted pod is not seen (only a TokenReview could); the token's short expiry bounds that.
 */
export class KubernetesAuthenticator implements CallerAuthenticator {
  private readonly cache: VerifiedTokenCache<Caller>;
  private readonly inflight = new Map<string, Promise<Caller>>();
  private callers = new Map<string, Caller>();
  private grants: Readonly<Record<string, SubjectGrant>> = {};

  constructor(private readonly options: KubernetesAuthOptions) {
    this.cache = new VerifiedTokenCache(options.cacheSize);
    this.replace(options.subjects);
  }

  /**
   * The grants of the reloaded configuration (a client added or removed, a subject granted);
   * callers verified before are verified again, under the new grants. `added`: the subjects
   * granted anew or otherwise than before.
   */
  async reloadNow(): Promise<CallerReload> {
    const next = this.options.currentSubjects?.();
    if (next === undefined) return { added: [], removed: [] };
    const before = this.grants;
    this.replace(next);
    const changed = (a: Readonly<Record<string, SubjectGrant>>, b: typeof a) =>
      Object.keys(a).filter((s) => JSON.stringify(a[s]) !== JSON.stringify(b[s]));
    const added = changed(next, before);
    if (added.length > 0 || changed(before, next).length > 0) this.cache.clear();
    return { added, removed: Object.keys(before).filter((s) => !(s in next)) };
  }

  private replace(subjects: Readonly<Record<string, SubjectGrant>>): void {
    const callers = new Map<string, Caller>();
    for (const [subject, grant] of Object.entries(subjects)) {
      callers.set(subject, grantedCaller(subject, grant));
    }
    this.callers = callers;
    this.grants = subjects;
  }

  authenticate(authorization: string | undefined): Caller | Promise<Caller> {
    // A cache hit needs no parsing: a regex over a ~1 KiB token costs more than the hash.
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
    // jose checks `iat` only against a maximum age: a token "issued" in the future would make
    // exp - iat as short as it likes while living as long as its exp.
    const nowSeconds = Math.floor(Date.now() / 1000);
    if (payload.iat! > nowSeconds + this.options.clockToleranceSeconds) {
      throw unauthenticated(
        `service-account token rejected: it was issued ${payload.iat! - nowSeconds} s in the future (its "iat"), beyond the ${this.options.clockToleranceSeconds} s of clock skew accepted; check the clocks of the cluster and the broker`,
      );
    }
    // Cached until `exp`, so the lifetime bounds how long a leaked token works here.
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
    // Cached like any other, so an ungranted token cannot make the broker verify again.
    const caller = this.callers.get(subject) ?? grantedCaller(subject, NO_GRANT);
    this.cache.set(id, caller, payload.exp! * 1000);
    return caller;
  }
}

/** 503 when the keys are unreachable; else 401 saying what to fix. */
function rejection(err: unknown): CallerAuthException {
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
