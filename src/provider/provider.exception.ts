import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

/** How a call to the provider failed. Each code decides retry and caller-visible behaviour. */
export enum ProviderErrorCode {
  /** No TCP/TLS connection (refused, DNS, connect timeout). */
  Unreachable = 'provider_unreachable',
  /** Connected, but no complete answer in time. */
  Timeout = 'provider_timeout',
  /** 5xx. */
  ServerError = 'provider_server_error',
  /** 429. */
  RateLimited = 'provider_rate_limited',
  /** 401 or `invalid_client`: the credentials were refused. Permanent until they change. */
  InvalidClient = 'provider_invalid_client',
  /** Another 4xx: the request itself was refused. Permanent. */
  Rejected = 'provider_rejected',
  /** 2xx whose body is not a usable token response (HTML, not JSON, no access_token, ...). */
  MalformedResponse = 'provider_malformed_response',
}

const TRANSIENT = new Set<ProviderErrorCode>([
  ProviderErrorCode.Unreachable,
  ProviderErrorCode.Timeout,
  ProviderErrorCode.ServerError,
  ProviderErrorCode.RateLimited,
  // A garbled answer is most often a proxy or a deployment in progress: retry, with backoff.
  ProviderErrorCode.MalformedResponse,
]);

/** What the provider's answer said about the failure, when it answered at all. */
export interface ProviderFailureDetails {
  /** The HTTP status. */
  status?: number;
  /** Its `Retry-After`, in milliseconds. */
  retryAfterMs?: number;
}

export interface ProviderExceptionOptions extends BrokerExceptionOptions, ProviderFailureDetails {}

/**
 * A failed provider call. Messages describe the failure (status, error code, shape) and never
 * include a response body verbatim: a body may echo credentials or a token.
 */
export class ProviderException extends BrokerException<ProviderErrorCode> {
  /** What the provider answered, for failure classification and backoff. */
  readonly details: ProviderFailureDetails;

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
