import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  type CryptoKey,
  exportJWK,
  generateKeyPair,
  type JWK,
  type JWTPayload,
  SignJWT,
} from 'jose';
import { EmulatorHttpServer, type EmulatorListenOptions, sendJson } from './emulator-http-server';

/** Signing algorithms Kubernetes uses for service-account tokens. */
export type ServiceAccountAlgorithm = 'RS256' | 'ES256';

/** How to mint a token with {@link ServiceAccountIssuer.token}. */
export interface ServiceAccountTokenOptions {
  /** `system:serviceaccount:<namespace>:<name>`. */
  subject: string;
  /** One audience or several (`aud` is always an array, as the kubelet writes it). @default the issuer's default audience */
  audience?: string | readonly string[];
  /** `nbf` in seconds from now (positive: not valid yet). @default 0 */
  notBeforeSeconds?: number;
  /** Overrides the `kid` header (e.g. a random one no JWKS has). */
  kid?: string;
  /** @default 'ES256' */
  alg?: ServiceAccountAlgorithm;
  /** Seconds from now; negative for an expired token. `null` omits `exp`. @default 3600 */
  expiresInSeconds?: number | null;
  /** `iat` in seconds from now (negative: issued in the past). `null` omits `iat`. @default 0 */
  issuedAtSeconds?: number | null;
  /** Overrides `iss` (a token from another cluster). */
  issuer?: string;
  /** Sign with a key the JWKS does not publish (an unknown `kid`). @default false */
  unpublishedKey?: boolean;
}

interface SigningKey {
  kid: string;
  alg: ServiceAccountAlgorithm;
  privateKey: CryptoKey;
  publicJwk: JWK;
}

/**
 * A Kubernetes service-account token issuer for tests and benchmarks: a JWKS endpoint over
 * real HTTP (what the API server serves at `/openid/v1/jwks`) and projected-token minting
 * with the claims the kubelet requests (`iss`, `sub`, `aud`, `exp`, `iat`, `nbf`).
 */
export class ServiceAccountIssuer {
  private published: SigningKey[] = [];
  private unpublished: SigningKey[] = [];
  private failure: number | null = null;
  private requests = 0;
  private http!: EmulatorHttpServer;

  private constructor(
    /** The `iss` of minted tokens. */
    readonly issuer: string,
    /** The default `aud` of minted tokens. */
    readonly audience: string,
  ) {}

  static async start(
    opts: EmulatorListenOptions & { issuer?: string; audience?: string } = {},
  ): Promise<ServiceAccountIssuer> {
    const issuer = new ServiceAccountIssuer(
      opts.issuer ?? 'https://kubernetes.default.svc.cluster.local',
      opts.audience ?? 'token-broker',
    );
    issuer.published = [await newKey('RS256'), await newKey('ES256')];
    issuer.unpublished = [await newKey('RS256'), await newKey('ES256')];
    issuer.http = await EmulatorHttpServer.listen(opts, (req, res) => issuer.handle(req, res));
    return issuer;
  }

  /** The JWKS URL to configure as `CALLER_AUTH_JWKS_URL`. */
  get jwksUrl(): string {
    return `${this.http.url}/openid/v1/jwks`;
  }

  /** JWKS requests served (or failed) so far. */
  get jwksRequests(): number {
    return this.requests;
  }

  /** The published public keys (a `JSON.stringify` of one is an HS256 "key confusion" secret). */
  get publicJwks(): readonly JWK[] {
    return this.published.map((k) => k.publicJwk);
  }

  /** Makes the JWKS endpoint answer `status` (or work again with `null`). */
  failJwks(status: number | null): void {
    this.failure = status;
  }

  /** Replaces the published keys with new ones (a key rotation on the API server). */
  async rotateKeys(): Promise<void> {
    this.published = [await newKey('RS256'), await newKey('ES256')];
  }

  /** Mints a projected service-account token. */
  async token(opts: ServiceAccountTokenOptions): Promise<string> {
    const alg = opts.alg ?? 'ES256';
    const key = (opts.unpublishedKey ? this.unpublished : this.published).find(
      (k) => k.alg === alg,
    )!;
    const now = Math.floor(Date.now() / 1000);
    const claims: JWTPayload = {
      iss: opts.issuer ?? this.issuer,
      sub: opts.subject,
      aud:
        typeof opts.audience === 'object' ? [...opts.audience] : [opts.audience ?? this.audience],
      nbf: now + (opts.notBeforeSeconds ?? 0),
      'kubernetes.io': { namespace: opts.subject.split(':')[2] },
    };
    const expiresIn = opts.expiresInSeconds === undefined ? 3600 : opts.expiresInSeconds;
    if (expiresIn !== null) claims.exp = now + expiresIn;
    if (opts.issuedAtSeconds !== null) claims.iat = now + (opts.issuedAtSeconds ?? 0);
    return new SignJWT(claims)
      .setProtectedHeader({ alg, kid: opts.kid ?? key.kid })
      .sign(key.privateKey);
  }

  async close(): Promise<void> {
    await this.http.close();
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.requests++;
    if (this.failure !== null) {
      sendJson(res, this.failure, { error: 'unavailable' });
      return;
    }
    if (req.method !== 'GET' || !req.url?.startsWith('/openid/v1/jwks')) {
      sendJson(res, 404, { error: 'not_found' });
      return;
    }
    sendJson(res, 200, { keys: this.publicJwks });
  }
}

async function newKey(alg: ServiceAccountAlgorithm): Promise<SigningKey> {
  const { privateKey, publicKey } = await generateKeyPair(alg);
  const kid = randomUUID();
  const publicJwk = { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' };
  return { kid, alg, privateKey, publicJwk };
}
