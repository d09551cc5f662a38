import { Agent, type Dispatcher, errors as undiciErrors } from 'undici';
import { type ProviderSettings, tokenCallDeadlineMs } from '../config/config.schema';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import { type GrantedToken, parseTokenResponse } from './token-response.parser';

/**
 * `clientCertificate`: a mutual-TLS client's own pool, for its token endpoint only. One pool per
 * origin keeps connections warm, so a refresh never pays a TLS handshake.
 */
export function createProviderAgent(
  settings: ProviderSettings,
  clientCertificate?: { cert: string; key: string },
): Agent {
  return new Agent({
    connect: { timeout: settings.connectTimeoutMs, ...clientCertificate },
    headersTimeout: settings.responseTimeoutMs,
    bodyTimeout: settings.responseTimeoutMs,
    keepAliveTimeout: 30_000,
    keepAliveMaxTimeout: 60_000,
    connections: 64,
  });
}

const CONNECT_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_CONNECT_TIMEOUT',
]);

/**
 * Errors raised while connecting: the request was never written, so it cannot have been acted
 * on. Anything later (reset, timeout, a socket closed mid-exchange) may have.
 */
export function failedToConnect(cause: unknown): boolean {
  const code = (cause as { code?: unknown } | undefined)?.code;
  return (
    cause instanceof undiciErrors.ConnectTimeoutError ||
    (typeof code === 'string' && CONNECT_ERROR_CODES.has(code))
  );
}

export function translateTransportError(cause: unknown, what: string): ProviderException {
  if (cause instanceof ProviderException) return cause;
  const code = (cause as { code?: string } | undefined)?.code ?? '';
  if (failedToConnect(cause)) {
    return new ProviderException(
      ProviderErrorCode.Unreachable,
      `${what}: cannot connect to the provider (${code || 'connect timeout'})`,
      { cause },
    );
  }
  if (
    cause instanceof undiciErrors.HeadersTimeoutError ||
    cause instanceof undiciErrors.BodyTimeoutError ||
    // By name: the deadline's DOMException is no `instanceof Error` of another realm (a test's).
    ['TimeoutError', 'AbortError'].includes(
      (cause as { name?: unknown } | undefined)?.name as string,
    )
  ) {
    return new ProviderException(
      ProviderErrorCode.Timeout,
      `${what}: the provider did not answer in time`,
      { cause },
    );
  }
  return new ProviderException(
    ProviderErrorCode.Unreachable,
    `${what}: the connection to the provider failed (${code || (cause instanceof Error ? cause.name : 'error')})`,
    { cause },
  );
}

/** More is an error, so a huge answer cannot exhaust memory. */
export async function readCapped(
  body: AsyncIterable<Buffer | Uint8Array> & { destroy?: (err?: Error) => unknown },
  limit: number,
): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > limit) {
      body.destroy?.();
      return undefined;
    }
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** Seconds or an HTTP date, into milliseconds. */
function parseRetryAfter(value: string | string[] | undefined): number | undefined {
  const v = Array.isArray(value) ? value[0] : value;
  if (v === undefined) return undefined;
  if (/^\d+$/.test(v.trim())) return Number(v.trim()) * 1000;
  const date = Date.parse(v);
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now());
}

/** The body is never quoted. */
function tokenErrorForStatus(
  what: string,
  status: number,
  body: string,
  retryAfterMs: number | undefined,
  check: string,
): ProviderException {
  const oauthError = readOAuthError(body);
  const suffix = oauthError ? ` (error "${oauthError}")` : '';
  if (status === 401 || oauthError === 'invalid_client') {
    return new ProviderException(
      ProviderErrorCode.InvalidClient,
      `${what}: the provider refused the client credentials (HTTP ${status}${suffix}); check ${check}`,
      { status },
    );
  }
  if (status === 429) {
    return new ProviderException(
      ProviderErrorCode.RateLimited,
      `${what}: rate limited by the provider (HTTP 429)`,
      { status, retryAfterMs },
    );
  }
  if (status >= 500) {
    return new ProviderException(
      ProviderErrorCode.ServerError,
      `${what}: the provider failed (HTTP ${status}${suffix})`,
      { status, retryAfterMs },
    );
  }
  return new ProviderException(
    ProviderErrorCode.Rejected,
    `${what}: the provider rejected the request (HTTP ${status}${suffix})`,
    { status },
  );
}

export interface TokenCall {
  readonly dispatcher: Dispatcher;
  readonly url: URL;
  readonly headers: Record<string, string>;
  readonly body?: string;
  readonly settings: ProviderSettings;
  readonly defaultLifetimeSeconds: number;
  /** The token's lifetime counts from here. */
  readonly sentAt: number;
  /** For error messages (`token request for client "…"`). */
  readonly what: string;
  /** What to check when the server refuses the client, for its message. */
  readonly check: string;
}

/** One total deadline: undici's idle timers never end a body trickling in. */
export async function postTokenRequest(call: TokenCall): Promise<GrantedToken> {
  const { url, settings, what } = call;
  let response: Dispatcher.ResponseData;
  let body: string | undefined;
  try {
    response = await call.dispatcher.request({
      origin: url.origin,
      path: `${url.pathname}${url.search}`,
      method: 'POST',
      headers: call.headers,
      body: call.body,
      headersTimeout: settings.responseTimeoutMs,
      bodyTimeout: settings.responseTimeoutMs,
      signal: AbortSignal.timeout(tokenCallDeadlineMs(settings)),
    });
    body = await readCapped(response.body, settings.maxTokenResponseBytes);
  } catch (cause) {
    throw translateTransportError(cause, what);
  }
  const status = response.statusCode;
  if (body === undefined) {
    throw new ProviderException(
      ProviderErrorCode.MalformedResponse,
      `${what}: the response exceeds ${settings.maxTokenResponseBytes} bytes`,
      { status },
    );
  }
  if (status >= 200 && status < 300) {
    return parseTokenResponse(body, call.sentAt, call.defaultLifetimeSeconds);
  }
  throw tokenErrorForStatus(
    what,
    status,
    body,
    parseRetryAfter(response.headers['retry-after']),
    call.check,
  );
}

/** Only a plausible identifier, never free text. */
function readOAuthError(body: string): string | undefined {
  try {
    const json = JSON.parse(body) as { error?: unknown };
    return typeof json.error === 'string' && /^[a-z_]{1,64}$/.test(json.error)
      ? json.error
      : undefined;
  } catch {
    return undefined;
  }
}
