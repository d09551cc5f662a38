import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import type { CallerAuthMode } from '../config/caller-auth.schema';
import { OAuthErrorCode, OAuthException } from './oauth.exception';

/** RFC 7523 §2.2. */
export const JWT_BEARER_ASSERTION = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer';

/** Largest form body read: a service-account assertion is ~1 KiB, the rest a few names. */
export const OAUTH_BODY_LIMIT_BYTES = 16_384;

/** Before any credential is checked. */
export interface OAuthTokenRequest {
  /** RFC 6749 §2.3.1, RFC 7523 §2.2; `none` sent nothing. */
  readonly method: 'client_secret_basic' | 'client_secret_post' | 'client_assertion' | 'none';
  /** As the configured authenticator reads it: `Bearer <key or JWT>`. */
  readonly authorization: string | undefined;
  readonly clientId: string | undefined;
  readonly target:
    | { readonly param: 'resource' | 'audience' | 'scope'; readonly value: string }
    | undefined;
  /** The call a DPoP client's hand-out proof is for (`dpop_htm`, `dpop_htu`). */
  readonly dpop?: { readonly method?: string; readonly url?: string };
}

/** Any other parameter is ignored (RFC 6749 §3.2). */
const KNOWN = [
  'grant_type',
  'client_id',
  'client_secret',
  'client_assertion',
  'client_assertion_type',
  'resource',
  'audience',
  'scope',
  'dpop_htm',
  'dpop_htu',
] as const;
type Params = Partial<Record<(typeof KNOWN)[number], string>>;
type ClientAuthentication = Omit<OAuthTokenRequest, 'target' | 'dpop'>;

const BASIC = /^Basic +([A-Za-z0-9+/]+={0,2}) *$/i;
const FORM = /^application\/x-www-form-urlencoded\s*(;|$)/i;

const invalid = (message: string) => new OAuthException(OAuthErrorCode.InvalidRequest, message);

/**
 * Exactly one client authentication method (two is `invalid_request`, RFC 6749 §2.3). Messages
 * never quote a submitted value: most are secrets.
 */
export function parseOAuthTokenRequest(
  contentType: string | undefined,
  body: string,
  authorization: string | undefined,
  mode: CallerAuthMode,
): OAuthTokenRequest {
  if (contentType === undefined || !FORM.test(contentType)) {
    throw invalid('send the parameters as application/x-www-form-urlencoded (RFC 6749 §4.4.2)');
  }
  const form = new URLSearchParams(body);
  const p: Params = {};
  for (const name of KNOWN) {
    const values = form.getAll(name);
    if (values.length > 1) throw invalid(`parameter "${name}" is repeated; give it once`);
    // RFC 6749 §3.2: a parameter sent without a value is treated as omitted.
    if (values.length === 1 && values[0] !== '') p[name] = values[0];
  }
  if (p.grant_type === undefined) throw invalid('parameter "grant_type" is required');
  if (p.grant_type !== 'client_credentials') {
    throw new OAuthException(
      OAuthErrorCode.UnsupportedGrantType,
      'only grant_type=client_credentials is supported',
    );
  }
  return {
    ...clientAuthentication(p, authorization, mode),
    target: target(p),
    ...((p.dpop_htm ?? p.dpop_htu) !== undefined && {
      dpop: { method: p.dpop_htm, url: p.dpop_htu },
    }),
  };
}

function clientAuthentication(
  p: Params,
  authorization: string | undefined,
  mode: CallerAuthMode,
): ClientAuthentication {
  if (authorization === REPEATED_AUTHORIZATION) {
    throw invalid('send one Authorization header; this request has several (RFC 6749 §2.3)');
  }
  const header = authorization !== undefined && authorization !== '';
  const post = p.client_secret !== undefined;
  const assertion = p.client_assertion !== undefined || p.client_assertion_type !== undefined;
  if (Number(header) + Number(post) + Number(assertion) > 1) {
    throw invalid('use exactly one client authentication method (RFC 6749 §2.3)');
  }
  if (header) return basicAuthentication(p, authorization, mode);
  if (post) {
    if (mode === 'kubernetes') throw unsupported('client_secret_post', mode, false);
    if (p.client_id === undefined) throw invalid('client_secret_post needs "client_id"');
    return authenticated('client_secret_post', p.client_secret!, p.client_id);
  }
  if (assertion) {
    if (p.client_assertion_type !== JWT_BEARER_ASSERTION) {
      throw invalid(`"client_assertion_type" must be ${JWT_BEARER_ASSERTION}`);
    }
    if (p.client_assertion === undefined) throw invalid('"client_assertion" is required');
    if (mode === 'api-key') throw unsupported('a client assertion', mode, false);
    return authenticated('client_assertion', p.client_assertion, p.client_id);
  }
  return { method: 'none', authorization: undefined, clientId: p.client_id };
}

function basicAuthentication(
  p: Params,
  authorization: string,
  mode: CallerAuthMode,
): ClientAuthentication {
  const basic = /^basic /i.test(authorization);
  if (!basic) throw unsupported('this Authorization scheme', mode, basic);
  if (mode === 'kubernetes') throw unsupported('client_secret_basic', mode, basic);
  const [id, secret] = basicCredentials(authorization);
  // `Bearer ` with nothing after it is no credential; refused here, before any authenticator
  // could compare it, whatever the configured key list holds.
  if (secret === '') {
    throw new OAuthException(
      OAuthErrorCode.InvalidClient,
      'the client secret in the Authorization header is empty; send the API key as the secret',
      { basicChallenge: true },
    );
  }
  if (p.client_id !== undefined && p.client_id !== id) {
    throw invalid('"client_id" differs from the client id in the Authorization header');
  }
  return authenticated('client_secret_basic', secret, id);
}

/** The credential as the configured authenticator reads it. */
function authenticated(
  method: ClientAuthentication['method'],
  credential: string,
  clientId: string | undefined,
): ClientAuthentication {
  return { method, authorization: `Bearer ${credential}`, clientId };
}

/** The Basic challenge answers a Basic header. */
function unsupported(method: string, mode: CallerAuthMode, basicChallenge: boolean) {
  return new OAuthException(
    OAuthErrorCode.InvalidClient,
    `${method} is not accepted here; this broker authenticates callers with ${describeMethods(mode)}`,
    { basicChallenge },
  );
}

/** RFC 6749 §2.3.1: base64 of `id:secret`, each form-urlencoded first. */
function basicCredentials(authorization: string): [string, string] {
  const match = BASIC.exec(authorization);
  const decoded = match ? Buffer.from(match[1], 'base64').toString('utf8') : '';
  const colon = decoded.indexOf(':');
  const bad = (options: { cause?: unknown } = {}) =>
    new OAuthException(
      OAuthErrorCode.InvalidClient,
      'the Authorization header must be "Basic base64(urlencoded client_id:urlencoded client_secret)"',
      { basicChallenge: true, ...options },
    );
  if (colon < 1) throw bad();
  try {
    const formDecode = (s: string) => decodeURIComponent(s.replace(/\+/g, ' '));
    return [formDecode(decoded.slice(0, colon)), formDecode(decoded.slice(colon + 1))];
  } catch (cause) {
    throw bad({ cause });
  }
}

/** `resource` (RFC 8707), else `audience`, else `scope`; two of them must agree. */
function target(p: Params): OAuthTokenRequest['target'] {
  const given = (['resource', 'audience', 'scope'] as const).filter((n) => p[n] !== undefined);
  if (given.length === 0) return undefined;
  const values = new Set(given.map((n) => p[n]));
  if (values.size > 1) {
    throw invalid(`${given.join(', ')} name different clients; name the client once`);
  }
  const param = given[0];
  const value = p[param]!;
  if (param === 'scope' && /\s/.test(value.trim())) {
    throw new OAuthException(OAuthErrorCode.InvalidScope, 'give one scope: the client id');
  }
  return { param, value: param === 'scope' ? value.trim() : value };
}

/**
 * `token_endpoint_auth_methods_supported` (RFC 8414). None for mode `kubernetes`: its
 * service-account token, sent as a client assertion, is a reusable bearer credential, not the
 * single-use assertion signed with the client's own key that `private_key_jwt` names, and no
 * registered method describes it. An empty list, not an absent one, which means
 * `client_secret_basic`.
 */
export function methodsFor(mode: CallerAuthMode): string[] {
  switch (mode) {
    case 'api-key':
      return ['client_secret_basic', 'client_secret_post'];
    case 'kubernetes':
      return [];
    case 'none':
      return ['none'];
  }
}

/** The methods {@link methodsFor} advertises, or what the caller sends instead, for messages. */
export function describeMethods(mode: CallerAuthMode): string {
  return mode === 'kubernetes'
    ? `its projected service-account token as client_assertion (client_assertion_type ${JWT_BEARER_ASSERTION})`
    : methodsFor(mode).join(' or ');
}
