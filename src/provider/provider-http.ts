import type * as undici from 'undici';
import type { ProviderSettings } from '../config/config.schema';
import { ProviderErrorCode, ProviderException } from './provider.exception';

/*
 * undici's dispatcher and errors without its index. The index also loads undici's fetch and
 * cookies modules, and the cookies module reads `globalThis.Headers` as it loads, which makes Node
 * load its own bundled undici as well: 3.6 MB of an idle replica's settled RSS on Node 26. undici 8
 * reads it only when called but needs Node >= 22.19; once Node 20 is dropped, import from 'undici'.
 * `provider-http.spec.ts` checks these are the index's own exports and that Node's copy stays out.
 */
/* eslint-disable @typescript-eslint/no-require-imports */
export const Agent = require('undici/lib/dispatcher/agent') as typeof undici.Agent;
export type Agent = undici.Agent;
const undiciErrors = require('undici/lib/core/errors') as typeof undici.errors;
/** The index adds it to every dispatcher's prototype; here it is called on one. */
const apiRequest = require('undici/lib/api/api-request') as (
  this: undici.Dispatcher,
  options: undici.Dispatcher.RequestOptions,
) => Promise<undici.Dispatcher.ResponseData>;
/* eslint-enable @typescript-eslint/no-require-imports */

/** `dispatcher.request(options)`. */
export function request(
  dispatcher: undici.Dispatcher,
  options: undici.Dispatcher.RequestOptions,
): Promise<undici.Dispatcher.ResponseData> {
  return apiRequest.call(dispatcher, options);
}

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
