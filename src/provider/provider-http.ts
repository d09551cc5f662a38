import type { SecureContext } from 'node:tls';
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
 * What one client's connections present (its certificate and key, for the mutual-TLS methods)
 * and trust (its `caFile` with Node's default CAs), built once for all its connections.
 */
export interface ClientTlsOptions {
  secureContext?: SecureContext;
}

/**
 * `clientTls`: one client's own pool, for its token endpoint only. One pool per origin keeps
 * connections warm, so a refresh never pays a TLS handshake.
 */
export function createProviderAgent(
  settings: ProviderSettings,
  clientTls?: ClientTlsOptions,
): Agent {
  return new Agent({
    connect: { timeout: settings.connectTimeoutMs, ...clientTls },
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

/** The server's certificate is not one this client trusts (OpenSSL's verify results). */
const UNTRUSTED_SERVER_CODES = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_UNTRUSTED',
  'CERT_SIGNATURE_FAILURE',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_REVOKED',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

/** The server ended the handshake over the client's certificate (a TLS alert). */
export const CERTIFICATE_ALERT =
  /^ERR_SSL_(?:SSLV3|TLSV1|TLSV13)_ALERT_(?:BAD_CERTIFICATE|CERTIFICATE_\w+|UNKNOWN_CA|ACCESS_DENIED|UNSUPPORTED_CERTIFICATE)$/;

/** A certificate and key that do not belong together, or key material OpenSSL cannot read. */
const KEY_MATERIAL_CODES = new Set([
  'ERR_OSSL_X509_KEY_VALUES_MISMATCH',
  'ERR_OSSL_PEM_NO_START_LINE',
  'ERR_OSSL_PEM_BAD_BASE64_DECODE',
  'ERR_OSSL_UNSUPPORTED',
]);

function codeOf(cause: unknown): string {
  const code = (cause as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' ? code : '';
}

/** Refused in the TLS handshake: before a byte of the request was read. */
function tlsRefusal(code: string): 'untrusted' | 'certificate' | 'key' | undefined {
  if (UNTRUSTED_SERVER_CODES.has(code)) return 'untrusted';
  if (CERTIFICATE_ALERT.test(code)) return 'certificate';
  if (KEY_MATERIAL_CODES.has(code)) return 'key';
  return undefined;
}

/**
 * Errors raised while connecting: the request was never written, so it cannot have been acted
 * on. Anything later (reset, timeout, a socket closed mid-exchange) may have. A TLS handshake
 * refused (by either side) is one: the server reads no request on a connection it refused.
 */
export function failedToConnect(cause: unknown): boolean {
  const code = codeOf(cause);
  return (
    cause instanceof undiciErrors.ConnectTimeoutError ||
    CONNECT_ERROR_CODES.has(code) ||
    tlsRefusal(code) !== undefined
  );
}

/** The settings a TLS failure of one client's connections points at, for its message. */
export interface TlsSettingNames {
  /** Where its certificate and key come from (a mutual-TLS client), e.g. `key files "..."`. */
  readonly certificate?: string;
  /** What it trusts the server by, e.g. `caFile "/etc/ca.pem"`. */
  readonly trust: string;
}

const DEFAULT_TRUST: TlsSettingNames = {
  trust: "Node's CAs and NODE_EXTRA_CA_CERTS (set the client's caFile to trust a private CA)",
};

/**
 * A TLS failure that no retry mends (an untrusted server certificate, a client certificate the
 * server refuses, a certificate and key that do not belong together) is the operator's: a
 * permanent {@link ProviderErrorCode.Misconfigured} naming the setting to fix.
 */
export function translateTransportError(
  cause: unknown,
  what: string,
  tls: TlsSettingNames = DEFAULT_TRUST,
): ProviderException {
  if (cause instanceof ProviderException) return cause;
  const code = codeOf(cause);
  const refusal = tlsRefusal(code);
  if (refusal !== undefined) return tlsMisconfigured(refusal, code, what, tls, cause);
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

/** A TLS failure no retry mends, naming what to fix. */
export function tlsMisconfigured(
  refusal: 'untrusted' | 'certificate' | 'key',
  how: string,
  what: string,
  tls: TlsSettingNames,
  cause?: unknown,
): ProviderException {
  const certificate = tls.certificate ?? "the client's credentials";
  const message = {
    untrusted: `the provider's TLS certificate is not trusted (${how}); the server is checked against ${tls.trust}`,
    certificate: `the provider refused the client certificate in the TLS handshake (${how}); check that the server trusts the issuer of the certificate in ${certificate}, has it registered, and that it has not expired`,
    key: `the client certificate and private key in ${certificate} cannot be used together (${how}): the key must be the certificate's own, both PEM`,
  }[refusal];
  return new ProviderException(ProviderErrorCode.Misconfigured, `${what}: ${message}`, {
    ...(cause !== undefined && { cause }),
  });
}

/** A connection the server closed or reset before answering: a refused certificate, maybe. */
export function closedBeforeAnswer(cause: unknown): boolean {
  return ['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE'].includes(codeOf(cause));
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
