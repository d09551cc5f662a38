import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

/** Each code decides retry and caller-visible behaviour. */
export enum ProviderErrorCode {
  /** No TCP/TLS connection (refused, DNS, connect timeout). */
  Unreachable = 'provider_unreachable',
  /** Connected, but no complete answer in time. */
  Timeout = 'provider_timeout',
  ServerError = 'provider_server_error',
  RateLimited = 'provider_rate_limited',
  /** 401 or `invalid_client`. Permanent until the credentials change. */
  InvalidClient = 'provider_invalid_client',
  /** Another 4xx. Permanent. */
  Rejected = 'provider_rejected',
  /** 2xx whose body is not a usable token response. */
  MalformedResponse = 'provider_malformed_response',
  /**
   * This client's TLS or metadata set-up cannot work (an untrusted server certificate, a
   * client certificate refused or not matching its key, metadata that refuses its settings).
   * Permanent until the configuration or the credentials change.
   */
  Misconfigured = 'provider_misconfigured',
}

const TRANSIENT = new Set<ProviderErrorCode>([
  ProviderErrorCode.Unreachable,
  ProviderErrorCode.Timeout,
  ProviderErrorCode.ServerError,
  ProviderErrorCode.RateLimited,
  // A garbled answer is most often a proxy or a deployment in progress: retry, with backoff.
  ProviderErrorCode.MalformedResponse,
]);

interface ProviderExceptionOptions extends BrokerExceptionOptions {
  status?: number;
  /** Milliseconds. */
  retryAfterMs?: number;
}

/** Messages never include a body verbatim: it may echo credentials or a token. */
export class ProviderException extends BrokerException<ProviderErrorCode> {
  readonly details: Pick<ProviderExceptionOptions, 'status' | 'retryAfterMs'>;

  constructor(code: ProviderErrorCode, message: string, options: ProviderExceptionOptions = {}) {
    super(code, message, options);
    const { status, retryAfterMs } = options;
    this.details = {
      ...(status !== undefined && { status }),
      ...(retryAfterMs !== undefined && { retryAfterMs }),
    };
  }

  /** Whether trying again later, unchanged, may succeed. */
  get transient(): boolean {
    return TRANSIENT.has(this.code);
  }
}
