import type { Logger } from 'pino';
import { z } from 'zod';
import { type ClientConfig, presentsCertificate } from '../config/client.schema';
import type { ProviderSettings } from '../config/config.schema';
import { tokenCallDeadlineMs } from '../config/config.schema';
import { tlsSettingNames } from './client-tls';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import {
  readCapped,
  request,
  translateTransportError,
  type TlsSettingNames,
} from './provider-http';
import type { Dispatcher } from 'undici';

/**
 * What the broker takes from an authorization server's RFC 8414 / OpenID Connect Discovery
 * metadata. Lists are `undefined` when the server does not publish them.
 */
export interface ProviderMetadata {
  readonly issuer: string;
  /** Where it was read from. */
  readonly from: string;
  readonly tokenEndpoint: string;
  /** RFC 8705 §5: `mtls_endpoint_aliases.token_endpoint`, for the mutual-TLS methods. */
  readonly mtlsTokenEndpoint?: string;
  readonly tokenEndpointAuthMethods?: readonly string[];
  readonly tokenEndpointAuthSigningAlgs?: readonly string[];
  /** RFC 9449 §5.1: the algorithms a DPoP proof may be signed with. */
  readonly dpopSigningAlgs?: readonly string[];
  /** RFC 8705 §3.3: whether it binds access tokens to the client certificate. */
  readonly certificateBoundAccessTokens?: boolean;
}

const url = z.string().refine((v) => URL.canParse(v) && /^https?:$/.test(new URL(v).protocol), {
  message: 'must be an absolute http(s) URL',
});
const names = z.array(z.string());

/** Fields the broker does not use are not looked at. */
const metadataJson = z.looseObject({
  issuer: z.string(),
  token_endpoint: url,
  token_endpoint_auth_methods_supported: names.optional(),
  token_endpoint_auth_signing_alg_values_supported: names.optional(),
  dpop_signing_alg_values_supported: names.optional(),
  mtls_endpoint_aliases: z.looseObject({ token_endpoint: url.optional() }).optional(),
  tls_client_certificate_bound_access_tokens: z.boolean().optional(),
});

/**
 * RFC 8414 §3.1 inserts the well-known suffix between the host and the issuer's path; OpenID
 * Connect Discovery §4 appends it to the issuer.
 */
export function metadataUrls(issuer: string): string[] {
  const u = new URL(issuer);
  const path = u.pathname === '/' ? '' : u.pathname.replace(/\/$/, '');
  return [
    `${u.origin}/.well-known/oauth-authorization-server${path}`,
    `${u.origin}${path}/.well-known/openid-configuration`,
  ];
}

/** A configured `auth` or assertion `alg` the server does not list: refused, named. */
export function checkAgainstMetadata(client: ClientConfig, metadata: ProviderMetadata): void {
  const r = client.tokenRequest;
  if (r.grant !== 'rfc6749') return;
  const where = `client "${client.id}": the metadata of tokenRequest.issuer "${metadata.issuer}" (${metadata.from})`;
  // RFC 8414 §2: omitted means client_secret_basic only.
  const methods = metadata.tokenEndpointAuthMethods ?? ['client_secret_basic'];
  if (!methods.includes(r.auth)) {
    throw new ProviderException(
      ProviderErrorCode.Misconfigured,
      `${where} does not list tokenRequest.auth "${r.auth}" in token_endpoint_auth_methods_supported (${methods.join(', ') || 'none'}${metadata.tokenEndpointAuthMethods === undefined ? ', the default when omitted' : ''}); set tokenRequest.auth to one of them`,
    );
  }
  const algs = metadata.tokenEndpointAuthSigningAlgs;
  const alg = r.assertion?.alg ?? 'RS256';
  if (r.auth === 'private_key_jwt' && algs !== undefined && !algs.includes(alg)) {
    throw new ProviderException(
      ProviderErrorCode.Misconfigured,
      `${where} does not list tokenRequest.assertion.alg "${alg}" in token_endpoint_auth_signing_alg_values_supported (${algs.join(', ')}); set tokenRequest.assertion.alg to one of them, with a key of that type`,
    );
  }
}

/** Where a client's token requests go: `tokenRequest.url` wins, else the metadata's. */
export function tokenEndpointFrom(client: ClientConfig, metadata: ProviderMetadata): string {
  const r = client.tokenRequest;
  if (r.grant === 'rfc6749' && r.url !== undefined) return r.url;
  if (r.grant === 'rfc6749' && presentsCertificate(r.auth) && metadata.mtlsTokenEndpoint) {
    return metadata.mtlsTokenEndpoint;
  }
  return metadata.tokenEndpoint;
}

export interface MetadataDeps {
  /** The pool to read `client`'s metadata on (its own when it has a `caFile`). */
  dispatcherFor(client: ClientConfig, what: string): Dispatcher;
  /** Closes the pools `dispatcherFor` hands out. */
  close?: () => Promise<void>;
  settings: ProviderSettings;
  logger?: Logger;
  now?: () => number;
}

/**
 * The metadata of each client's `tokenRequest.issuer`: read at start, re-read every
 * `metadataRefreshSeconds`, a failed re-read logged and the last good metadata kept. A client
 * whose metadata could never be read is that client's failure only (its token requests fail
 * with the reason; readiness names it), not the replica's.
 */
export class ProviderMetadataCache {
  private readonly known = new Map<string, { metadata: ProviderMetadata; readAt: number }>();
  private readonly reading = new Map<string, Promise<ProviderMetadata>>();
  private readonly timers = new Set<ReturnType<typeof setInterval>>();
  private readonly now: () => number;

  constructor(private readonly deps: MetadataDeps) {
    this.now = deps.now ?? Date.now;
  }

  /** Reads every client's metadata now and schedules the re-reads; never throws. */
  start(clients: readonly ClientConfig[]): void {
    const periodMs = this.deps.settings.metadataRefreshSeconds * 1000;
    for (const client of clients) {
      if (client.tokenRequest.grant !== 'rfc6749' || client.tokenRequest.issuer === undefined) {
        continue;
      }
      void this.get(client).catch(() => undefined);
      const timer = setInterval(() => void this.refresh(client), periodMs);
      timer.unref();
      this.timers.add(timer);
    }
  }

  /** Stops the re-reads and closes the pools. */
  async close(): Promise<void> {
    for (const t of this.timers) clearInterval(t);
    this.timers.clear();
    await this.deps.close?.();
  }

  /** What is known, without I/O: for the DPoP algorithms, say. */
  peek(clientId: string): ProviderMetadata | undefined {
    return this.known.get(clientId)?.metadata;
  }

  /**
   * `undefined` for a client without `tokenRequest.issuer`. Throws {@link ProviderException}
   * while none was ever read (transient for a server that does not answer, permanent for
   * metadata that cannot serve this client).
   */
  async get(client: ClientConfig): Promise<ProviderMetadata | undefined> {
    if (client.tokenRequest.grant !== 'rfc6749' || client.tokenRequest.issuer === undefined) {
      return undefined;
    }
    const known = this.known.get(client.id);
    if (known) return known.metadata;
    return this.read(client);
  }

  /** One re-read, as the timer runs it: a failure is logged, the last good metadata kept. */
  async refresh(client: ClientConfig): Promise<void> {
    try {
      await this.read(client);
    } catch (err) {
      const kept = this.known.has(client.id);
      this.deps.logger?.warn(
        { client: client.id, err: (err as Error).message },
        kept
          ? 'provider metadata re-read failed; the last good metadata is kept'
          : 'provider metadata could not be read',
      );
    }
  }

  private read(client: ClientConfig): Promise<ProviderMetadata> {
    const inFlight = this.reading.get(client.id);
    if (inFlight) return inFlight;
    const reading = this.fetch(client)
      .then((metadata) => {
        checkAgainstMetadata(client, metadata);
        this.known.set(client.id, { metadata, readAt: this.now() });
        return metadata;
      })
      .finally(() => this.reading.delete(client.id));
    this.reading.set(client.id, reading);
    return reading;
  }

  private async fetch(client: ClientConfig): Promise<ProviderMetadata> {
    const issuer = client.tokenRequest.issuer!;
    const what = `metadata of tokenRequest.issuer "${issuer}" for client "${client.id}"`;
    const dispatcher = this.deps.dispatcherFor(client, what);
    const tried: string[] = [];
    for (const from of metadataUrls(issuer)) {
      const answer = await this.getJson(dispatcher, from, what, tlsSettingNames(client));
      if (answer.status === 404 || answer.status === 405) {
        tried.push(`${from}: HTTP ${answer.status}`);
        continue;
      }
      if (answer.status >= 500 || answer.status === 429) {
        throw new ProviderException(
          ProviderErrorCode.ServerError,
          `${what}: ${from} answered HTTP ${answer.status}`,
          { status: answer.status },
        );
      }
      if (answer.status !== 200) {
        throw new ProviderException(
          ProviderErrorCode.Misconfigured,
          `${what}: ${from} answered HTTP ${answer.status}; check tokenRequest.issuer`,
          { status: answer.status },
        );
      }
      return parseMetadata(answer.body, from, issuer, what);
    }
    throw new ProviderException(
      ProviderErrorCode.Misconfigured,
      `${what}: the server publishes no metadata (${tried.join('; ')}); check tokenRequest.issuer, or set tokenRequest.url instead`,
    );
  }

  private async getJson(
    dispatcher: Dispatcher,
    from: string,
    what: string,
    names: TlsSettingNames,
  ): Promise<{ status: number; body?: string }> {
    const settings = this.deps.settings;
    const u = new URL(from);
    try {
      const response = await request(dispatcher, {
        origin: u.origin,
        path: `${u.pathname}${u.search}`,
        method: 'GET',
        headers: { accept: 'application/json' },
        headersTimeout: settings.responseTimeoutMs,
        bodyTimeout: settings.responseTimeoutMs,
        signal: AbortSignal.timeout(tokenCallDeadlineMs(settings)),
      });
      const body = await readCapped(response.body, settings.maxTokenResponseBytes);
      if (body === undefined) {
        throw new ProviderException(
          ProviderErrorCode.MalformedResponse,
          `${what}: ${from} answered more than ${settings.maxTokenResponseBytes} bytes`,
        );
      }
      return { status: response.statusCode, body };
    } catch (cause) {
      throw translateTransportError(cause, what, names);
    }
  }
}

function parseMetadata(
  body: string | undefined,
  from: string,
  issuer: string,
  what: string,
): ProviderMetadata {
  let json: unknown;
  try {
    json = JSON.parse(body ?? '');
  } catch {
    throw new ProviderException(
      ProviderErrorCode.MalformedResponse,
      `${what}: ${from} did not answer JSON`,
    );
  }
  const parsed = metadataJson.safeParse(json);
  if (!parsed.success) {
    const bad = [...new Set(parsed.error.issues.map((i) => i.path.join('.') || '(root)'))];
    throw new ProviderException(
      ProviderErrorCode.Misconfigured,
      `${what}: ${from} is not usable authorization server metadata (${bad.join(', ')} missing or invalid)`,
    );
  }
  const m = parsed.data;
  // RFC 8414 §3.3: a document naming another issuer must not be used (mix-up, impersonation).
  if (m.issuer !== issuer) {
    throw new ProviderException(
      ProviderErrorCode.Misconfigured,
      `${what}: ${from} names issuer "${m.issuer}", not the configured tokenRequest.issuer "${issuer}"; they must be equal, character for character`,
    );
  }
  const alias = m.mtls_endpoint_aliases?.token_endpoint;
  // The secret or the token travels there: an https issuer may not send it in clear.
  for (const [field, value] of [
    ['token_endpoint', m.token_endpoint],
    ['mtls_endpoint_aliases.token_endpoint', alias],
  ] as const) {
    if (value !== undefined && issuer.startsWith('https:') && !value.startsWith('https:')) {
      throw new ProviderException(
        ProviderErrorCode.Misconfigured,
        `${what}: ${from} names a plain http:// ${field} for an https:// issuer; refused, the credentials would travel in clear`,
      );
    }
  }
  return {
    issuer: m.issuer,
    from,
    tokenEndpoint: m.token_endpoint,
    ...(alias !== undefined && { mtlsTokenEndpoint: alias }),
    ...(m.token_endpoint_auth_methods_supported && {
      tokenEndpointAuthMethods: m.token_endpoint_auth_methods_supported,
    }),
    ...(m.token_endpoint_auth_signing_alg_values_supported && {
      tokenEndpointAuthSigningAlgs: m.token_endpoint_auth_signing_alg_values_supported,
    }),
    ...(m.dpop_signing_alg_values_supported && {
      dpopSigningAlgs: m.dpop_signing_alg_values_supported,
    }),
    ...(m.tls_client_certificate_bound_access_tokens !== undefined && {
      certificateBoundAccessTokens: m.tls_client_certificate_bound_access_tokens,
    }),
  };
}
