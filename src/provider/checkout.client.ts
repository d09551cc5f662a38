import { Agent, errors as undiciErrors } from './undici-agent';
import type { ClientConfig } from '../config/client.schema';
import type { OrdersSettings } from '../config/config.schema';
import type { ProviderException } from './provider.exception';

/** One create-order call as the orders feature hands it over. */
export interface CheckoutRequest {
  readonly client: ClientConfig;
  readonly accessToken: string;
  /** The caller's JSON, byte for byte. */
  readonly body: Buffer;
  /**
   * Headers to pass on (idempotency key, request id, trace context), names lowercased. The
   * adapter adds the provider's own create-order headers and the bearer token.
   */
  readonly headers: Readonly<Record<string, string>>;
}

/** The provider's answer, whatever its status. */
export interface CheckoutAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly contentType?: string;
  readonly retryAfter?: string;
  readonly body: Buffer;
}

/**
 * The call failed. `delivered` is what decides whether an order may exist: `no` only when no
 * byte can have reached the provider (no connection was made); otherwise `maybe`.
 */
export interface CheckoutFailure {
  readonly kind: 'failed';
  readonly delivered: 'no' | 'maybe';
  readonly error: ProviderException;
}

export type CheckoutOutcome = CheckoutAnswer | CheckoutFailure;

/** The provider's checkout API, as the orders feature sees it. */
export interface CheckoutGateway {
  /** Sends the order once. Never throws for a transport failure: see {@link CheckoutFailure}. */
  createOrder(request: CheckoutRequest): Promise<CheckoutOutcome>;
  close(): Promise<void>;
}

/**
 * Errors raised while connecting: the request was never written, so it cannot have created an
 * order. Anything later (reset, timeout, a socket closed mid-exchange) may have.
 */
const CONNECT_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_CONNECT_TIMEOUT',
]);

/**
 * The keep-alive pool for the checkout API. Its own pool, not the token endpoint's: the auth
 * server usually shares the host, and a slow checkout API holding every connection must never
 * delay a token refresh. Its own connect timeout too (`orders.connectTimeoutMs`).
 */
export function createCheckoutAgent(settings: OrdersSettings): Agent {
  return new Agent({
    connect: { timeout: settings.connectTimeoutMs },
    headersTimeout: settings.headersTimeoutMs,
    bodyTimeout: settings.bodyTimeoutMs,
    keepAliveTimeout: 30_000,
    keepAliveMaxTimeout: 60_000,
    connections: 128,
  });
}

/** Whether `cause` certainly happened before any byte of the request was written. */
export function wasNeverSent(cause: unknown): boolean {
  if (cause instanceof undiciErrors.ConnectTimeoutError) return true;
  const code = (cause as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' && CONNECT_ERROR_CODES.has(code);
}
