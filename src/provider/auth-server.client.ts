import { createPrivateKey, type KeyObject, randomUUID } from 'node:crypto';
import {
  assertionSettingsSchema,
  type ClientAuthMethod,
  type ClientConfig,
  presentsCertificate,
} from '../config/client.schema';
import { type ProviderSettings, tokenCallDeadlineMs } from '../config/config.schema';
import { DpopKeyError, type DpopSigner, nonceOf } from '../dpop/dpop-proofs';
import type { ClientCredentials } from '../secrets/client-credentials';
import { ClientAgents, probeCertificateRefusal, tlsSettingNames } from './client-tls';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import {
  closedBeforeAnswer,
  createProviderAgent,
  readCapped,
  request,
  type TlsSettingNames,
  tlsMisconfigured,
  translateTransportError,
} from './provider-http';
import { type ProviderMetadataCache, tokenEndpointFrom } from './provider-metadata';
import {
  type GrantedToken,
  parseTokenResponse,
  readOAuthError,
  tokenErrorForStatus,
} from './token-response.parser';
import type { Dispatcher } from 'undici';

/** Appended to a client's `authUrl` in the provider's dialect. */
const TOKEN_PATH = '/api/auth/v1/oauth/token';

/**
 * Where a client's token requests go (no query): the key of the fleet's bound on them. A client
 * configured by `tokenRequest.issuer` alone is keyed by its issuer (one server's endpoints).
 */
export function tokenEndpointOf(client: ClientConfig): string {
  const r = client.tokenRequest;
  const url = new URL(
    r.grant === 'rfc6749' ? (r.url ?? r.issuer!) : `${client.authUrl}${TOKEN_PATH}`,
  );
  return `${url.origin}${url.pathname}`;
}
const ASSERTION_TYPE = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer';
const DEFAULT_ASSERTION = assertionSettingsSchema.parse({});

/** By how the client authenticates. */
export const INVALID_CLIENT_CHECKS: Record<ClientAuthMethod, string> = {
  client_secret_basic: 'the client_id and client_secret in the credentials',
  client_secret_post: 'the client_id and client_secret in the credentials',
  private_key_jwt:
    "the client_id, and that the server holds the public key of the credentials' private key under the kid and alg of tokenRequest.assertion",
  tls_client_auth:
    'the client_id, and that the server has registered the client certificate (its subject or SAN) and trusts its issuer',
  self_signed_tls_client_auth:
    "the client_id, and that the server holds the client certificate's public key (its jwks or jwks_uri)",
};

/** A token request, as each grant builds it. */
interface TokenCall {
  readonly dispatcher: Dispatcher;
  readonly url: URL;
  readonly headers: Record<string, string>;
  readonly body?: string;
  /** What to check when the server refuses the client, for its message. */
  readonly check: string;
}

/** What the token endpoint adapter needs beyond its pool and settings. */
export interface AuthServerExtras {
  /** The metadata of clients configured by `tokenRequest.issuer`. */
  metadata?: ProviderMetadataCache;
  /** Told the credentials a mutual-TLS client was granted a token with: its API calls' too. */
  onGranted?: (client: ClientConfig, credentials: ClientCredentials) => void;
  /** A client's `caFile` is re-read this often. @default 60 s */
  caMaxAgeMs?: number;
  /** Signs the proofs of clients with `dpop` settings. */
  dpop?: DpopSigner;
}

export interface TokenGrantor {
  /** Throws {@link ProviderException}. */
  requestToken(client: ClientConfig, credentials: ClientCredentials): Promise<GrantedToken>;
}

/**
 * A client's token request, by `tokenRequest.grant`. `provider-query`, the provider's dialect:
 * `grant_type` in the **query string**, Basic authentication and no body, as the provider
 * documents it (stock OAuth clients send a form body, hence hand-written). `rfc6749`: RFC 6749
 * §4.4 with `client_secret_basic`, `client_secret_post`, `private_key_jwt` (RFC 7523) or
 * `tls_client_auth` (RFC 8705). Either answer is read the same way.
 */
export class AuthServerClient implements TokenGrantor {
  /** A client's own pool (its certificate, its CA), rebuilt when they change. */
  private readonly agents: ClientAgents;

  /** `dispatcher`: the shared keep-alive pool, closed with the client. */
  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly settings: ProviderSettings,
    private readonly defaultLifetimeSeconds: number,
    private readonly now: () => number = Date.now,
    private readonly extras: AuthServerExtras = {},
  ) {
    this.agents = new ClientAgents(
      (options) => createProviderAgent(settings, options),
      extras.caMaxAgeMs ?? 60_000,
      now,
    );
  }

  /** The pool for a client that presents no certificate: its own when it has a `caFile`. */
  private dispatcherFor(client: ClientConfig, what: string): Dispatcher {
    return this.agents.agentFor(client, undefined, what) ?? this.dispatcher;
  }

  async requestToken(client: ClientConfig, credentials: ClientCredentials): Promise<GrantedToken> {
    const what = `token request for client "${client.id}"`;
    if (client.tokenRequest.grant === 'provider-query') {
      return this.post(
        what,
        this.providerQuery(client, credentials, what),
        tlsSettingNames(client),
      );
    }
    // A DPoP client's request is rebuilt for its nonce retry: a client assertion is single-use.
    const send = (dpop?: string) => this.rfc6749(client, credentials, what, dpop);
    return client.dpop === undefined
      ? send()
      : dpopTokenRequest(this.signer(what), client, what, send);
  }

  private async rfc6749(
    client: ClientConfig,
    credentials: ClientCredentials,
    what: string,
    dpop: string | undefined,
  ): Promise<GrantedToken & { nonce?: string }> {
    const profile = client.tokenRequest;
    const metadata = profile.issuer !== undefined ? await this.metadataOf(client) : undefined;
    const url = metadata ? tokenEndpointFrom(client, metadata) : profile.url!;
    const form = new URLSearchParams({ grant_type: 'client_credentials' });
    if (profile.scope !== undefined) form.set('scope', profile.scope);
    if (profile.audience !== undefined) form.set('audience', profile.audience);
    for (const resource of profile.resource ?? []) form.append('resource', resource);
    for (const [name, value] of Object.entries(profile.params ?? {})) form.set(name, value);
    const headers: Record<string, string> = {
      ...profile.headers,
      'content-type': 'application/x-www-form-urlencoded',
      accept: 'application/json',
      ...(dpop !== undefined && { dpop }),
    };
    const dispatcher = await this.authenticate(client, credentials, form, headers, what, url);
    const names = tlsSettingNames(client);
    const granted = await this.post(
      what,
      {
        dispatcher,
        url: new URL(url),
        headers,
        body: form.toString(),
        check: INVALID_CLIENT_CHECKS[profile.auth],
      },
      names,
    ).catch(async (err: unknown) => {
      // A server that refuses the certificate often just closes the connection: ask it.
      const options = this.agents.optionsOf(client.id);
      if (presentsCertificate(profile.auth) && options && closedBeforeAnswer(errorCause(err))) {
        const how = await probeCertificateRefusal(url, options, this.settings.connectTimeoutMs);
        if (how !== undefined) throw tlsMisconfigured('certificate', how, what, names, err);
      }
      throw err;
    });
    // The certificate this token is bound to (RFC 8705 §3): the one its API calls present.
    if (presentsCertificate(profile.auth)) this.extras.onGranted?.(client, credentials);
    return granted;
  }

  private async metadataOf(client: ClientConfig) {
    if (this.extras.metadata === undefined) {
      // Wired by the provider module; reaching here is a wiring error.
      throw new ProviderException(
        ProviderErrorCode.Misconfigured,
        `token request for client "${client.id}": tokenRequest.issuer is set but no metadata reader is wired`,
      );
    }
    return (await this.extras.metadata.get(client))!;
  }

  private signer(what: string): DpopSigner {
    if (this.extras.dpop === undefined) {
      throw new ProviderException(ProviderErrorCode.Rejected, `${what}: no DPoP signer is wired`);
    }
    return this.extras.dpop;
  }

  /** One total deadline: undici's idle timers never end a body trickling in. */
  private async post(
    what: string,
    call: TokenCall,
    tls: TlsSettingNames,
  ): Promise<GrantedToken & { nonce?: string }> {
    const { url, headers, body: requestBody } = call;
    const settings = this.settings;
    // Expiry counts from *before* the request: the server's clock started no earlier.
    const sentAt = this.now();
    let response: Dispatcher.ResponseData;
    let body: string | undefined;
    try {
      response = await request(call.dispatcher, {
        origin: url.origin,
        path: `${url.pathname}${url.search}`,
        method: 'POST',
        headers,
        body: requestBody,
        headersTimeout: settings.responseTimeoutMs,
        bodyTimeout: settings.responseTimeoutMs,
        signal: AbortSignal.timeout(tokenCallDeadlineMs(settings)),
      });
      body = await readCapped(response.body, settings.maxTokenResponseBytes);
    } catch (cause) {
      throw translateTransportError(cause, what, tls);
    }
    const status = response.statusCode;
    const nonce = nonceOf(response.headers['dpop-nonce']);
    if (body === undefined) {
      throw new ProviderException(
        ProviderErrorCode.MalformedResponse,
        `${what}: the response exceeds ${settings.maxTokenResponseBytes} bytes`,
        { status },
      );
    }
    if (status >= 200 && status < 300) {
      return { ...parseTokenResponse(body, sentAt, this.defaultLifetimeSeconds), nonce };
    }
    const error = tokenErrorForStatus(
      what,
      status,
      body,
      response.headers['retry-after'],
      call.check,
    );
    if (nonce === undefined) throw error;
    throw Object.assign(error, { nonce, useNonce: readOAuthError(body) === 'use_dpop_nonce' });
  }

  /** The provider's dialect: `POST {authUrl}/api/auth/v1/oauth/token?grant_type=...`. */
  private providerQuery(client: ClientConfig, credentials: ClientCredentials, what: string) {
    if (credentials.clientSecret === undefined) {
      // The credentials loader refuses this for client_secret_basic; a wiring error otherwise.
      throw new ProviderException(
        ProviderErrorCode.Rejected,
        `${what}: the credentials lack client_secret`,
      );
    }
    const url = new URL(`${client.authUrl!}${TOKEN_PATH}`);
    url.searchParams.set('grant_type', 'client_credentials');
    // RFC 6749 §2.3.1: id and secret are form-urlencoded before Basic encoding.
    const basic = Buffer.from(
      `${encodeURIComponent(credentials.clientId)}:${encodeURIComponent(credentials.clientSecret)}`,
    ).toString('base64');
    return {
      dispatcher: this.dispatcherFor(client, what),
      url,
      headers: { authorization: `Basic ${basic}`, accept: 'application/json' },
      check: 'the client id/secret for this merchant and environment',
    };
  }

  /** Returns the pool to send on (the client's own for the mutual-TLS methods). */
  private async authenticate(
    client: ClientConfig,
    credentials: ClientCredentials,
    form: URLSearchParams,
    headers: Record<string, string>,
    what: string,
    tokenUrl: string,
  ): Promise<Dispatcher> {
    switch (client.tokenRequest.auth) {
      case 'client_secret_basic': {
        // RFC 6749 §2.3.1: id and secret are form-urlencoded before Basic encoding.
        const basic = Buffer.from(
          `${formEncode(credentials.clientId)}:${formEncode(need(credentials.clientSecret, what, 'client_secret'))}`,
        ).toString('base64');
        headers.authorization = `Basic ${basic}`;
        return this.dispatcherFor(client, what);
      }
      case 'client_secret_post':
        form.set('client_id', credentials.clientId);
        form.set('client_secret', need(credentials.clientSecret, what, 'client_secret'));
        return this.dispatcherFor(client, what);
      case 'private_key_jwt':
        form.set('client_id', credentials.clientId);
        form.set('client_assertion_type', ASSERTION_TYPE);
        form.set('client_assertion', await this.assertion(client, credentials, what, tokenUrl));
        return this.dispatcherFor(client, what);
      case 'tls_client_auth':
      case 'self_signed_tls_client_auth': {
        form.set('client_id', credentials.clientId);
        // Its certificate is presented to no one else.
        const tls = {
          clientId: credentials.clientId,
          certificate: need(credentials.certificate, what, 'certificate'),
          privateKey: need(credentials.privateKey, what, 'private_key'),
        };
        return this.agents.agentFor(client, tls, what)!;
      }
    }
  }

  async close(): Promise<void> {
    await Promise.all([this.dispatcher.close(), this.agents.close()]);
  }

  /**
   * RFC 7523 §3: `iss` and `sub` the client id, `aud` the token endpoint posted to (or the
   * issuer), a fresh `jti`, `iat` now and `exp` a short lifetime later, which keep a captured
   * assertion from replay.
   */
  private async assertion(
    client: ClientConfig,
    credentials: ClientCredentials,
    what: string,
    tokenUrl: string,
  ): Promise<string> {
    const settings = client.tokenRequest.assertion ?? DEFAULT_ASSERTION;
    const { key, kid } = privateKeyOf(need(credentials.privateKey, what, 'private_key'), what);
    const issuedAt = Math.floor(this.now() / 1000);
    // Loaded on first use: only private_key_jwt clients need jose.
    const { SignJWT } = await import('jose');
    try {
      return await new SignJWT({})
        .setProtectedHeader({
          alg: settings.alg,
          typ: 'JWT',
          ...((settings.kid ?? kid) !== undefined && { kid: settings.kid ?? kid }),
        })
        .setIssuer(credentials.clientId)
        .setSubject(credentials.clientId)
        .setAudience(settings.audience === 'issuer' ? client.tokenRequest.issuer! : tokenUrl)
        .setJti(randomUUID())
        .setIssuedAt(issuedAt)
        .setExpirationTime(issuedAt + settings.lifetimeSeconds)
        .sign(key);
    } catch (cause) {
      // jose says which algorithm and key type disagree; it never quotes the key.
      throw new ProviderException(
        ProviderErrorCode.Rejected,
        `${what}: cannot sign the client assertion with alg "${settings.alg}" (${cause instanceof Error ? cause.message : 'error'}); check tokenRequest.assertion.alg against the key type`,
        { cause },
      );
    }
  }
}

function errorCause(err: unknown): unknown {
  return err instanceof ProviderException ? err.cause : err;
}

/**
 * RFC 9449 §5 and §8: a proof with the authorization server's last nonce; its `use_dpop_nonce`
 * answer (with the new nonce) is retried once, and a `DPoP-Nonce` on any answer is learnt for
 * the fleet. A bearer answer to a proof is refused: the server did not bind the token.
 */
async function dpopTokenRequest(
  dpop: DpopSigner,
  client: ClientConfig,
  what: string,
  send: (proof: string) => Promise<GrantedToken & { nonce?: string }>,
): Promise<GrantedToken> {
  const url = client.tokenRequest.url!;
  for (let attempt = 0; ; attempt++) {
    let proof: string;
    try {
      proof = await dpop.proof(client, { method: 'POST', url, server: 'as' });
    } catch (cause) {
      // Retried as any failure is, unless an operator must fix the key first.
      if (cause instanceof DpopKeyError && !cause.permanent) throw cause;
      throw new ProviderException(
        ProviderErrorCode.Rejected,
        `${what}: cannot sign the DPoP proof: ${cause instanceof Error ? cause.message : 'error'}`,
        { cause },
      );
    }
    try {
      const { nonce, ...granted } = await send(proof);
      if (nonce !== undefined) await dpop.learn(client, 'as', url, nonce);
      if (granted.tokenType !== 'DPoP') {
        throw new ProviderException(
          ProviderErrorCode.Rejected,
          `${what}: the server answered a DPoP proof with token_type "Bearer": it does not bind this client's tokens; enable DPoP for the client at the server, or remove dpop from client "${client.id}"`,
        );
      }
      return granted;
    } catch (err) {
      const { nonce, useNonce } = err as { nonce?: string; useNonce?: boolean };
      if (nonce === undefined) throw err;
      await dpop.learn(client, 'as', url, nonce);
      // Once: a second nonce challenge in a row is the server's problem, not a stale nonce.
      if (attempt > 0 || useNonce !== true) throw err;
    }
  }
}

/** RFC 6749 Appendix B (spaces as `+`). */
function formEncode(value: string): string {
  return new URLSearchParams({ v: value }).toString().slice(2);
}

function need(value: string | undefined, what: string, field: string): string {
  if (value === undefined) {
    // The credentials loader checks this per method; reaching here is a wiring error.
    throw new ProviderException(
      ProviderErrorCode.Rejected,
      `${what}: the credentials lack ${field}, which this client's tokenRequest.auth needs`,
    );
  }
  return value;
}

/** PEM (PKCS#8, PKCS#1 or SEC1) or JWK. */
function privateKeyOf(text: string, what: string): { key: KeyObject; kid?: string } {
  try {
    const trimmed = text.trim();
    if (trimmed.startsWith('{')) {
      const jwk = JSON.parse(trimmed) as { kid?: unknown } & Record<string, unknown>;
      const kid = typeof jwk.kid === 'string' ? jwk.kid : undefined;
      return { key: createPrivateKey({ key: jwk, format: 'jwk' }), ...(kid && { kid }) };
    }
    return { key: createPrivateKey(trimmed) };
  } catch {
    // No cause: a parser's message may quote the key.
    throw new ProviderException(
      ProviderErrorCode.Rejected,
      `${what}: the credentials' private_key is neither a PEM private key nor a private JWK`,
    );
  }
}
