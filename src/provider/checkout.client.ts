import type { IncomingHttpHeaders } from 'node:http';
import type { Dispatcher } from 'undici';
import { Agent, errors as undiciErrors } from './undici-agent';
import {
  type ClientConfig,
  ordersCallDeadlineMs,
  type OrdersSettings,
} from '../config/config.schema';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import { translateTransportError } from './provider-http';

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

/**
 * The provider's create-order call: `POST {base_url}{ordersPath}` with
 * `Content-Type: application/json`, `Accept: application/json` and the bearer token; the body
 * is passed through untouched.
 *
 * It never retries: a POST that may have reached the provider must not be sent twice, and the
 * one safe retry (after a 401, which the provider refused) is the orders service's decision.
 */
export class CheckoutClient implements CheckoutGateway {
  private readonly targets = new Map<string, { origin: string; path: string }>();

  private readonly deadlineMs: number;

  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly settings: OrdersSettings,
    private readonly userAgent = 'token-broker',
  ) {
    this.deadlineMs = ordersCallDeadlineMs(settings);
  }

  /**
   * Undici's `dispatch` with a handler rather than `request`: the answer is collected into one
   * buffer as it arrives, with no body stream and no promise per chunk. Measured here, that
   * took a tenth off the broker's CPU per order.
   */
  createOrder(request: CheckoutRequest): Promise<CheckoutOutcome> {
    const { client } = request;
    const url = this.targetOf(client);
    const limit = this.settings.maxResponseBytes;
    const what = () => `create-order request for client "${client.id}"`;
    return new Promise((settle) => {
      let status = 0;
      let headers: IncomingHttpHeaders = {};
      let chunks: Buffer[] = [];
      let size = 0;
      let tooLarge = false;
      let inFlight: Dispatcher.DispatchController | undefined;
      let expired: ProviderException | undefined;
      // The one deadline of the whole call: undici's body timeout is an idle timer, which a
      // provider sending a byte now and then never trips.
      const deadline = setTimeout(() => {
        expired = new ProviderException(
          ProviderErrorCode.Timeout,
          `${what()}: the provider did not answer in full within ${this.deadlineMs} ms`,
        );
        if (inFlight) {
          inFlight.abort(expired);
          return;
        }
        // Still queued for a connection: nothing was written, and nothing will be.
        resolve({
          kind: 'failed',
          delivered: 'no',
          error: new ProviderException(
            ProviderErrorCode.Timeout,
            `${what()}: no connection to the provider came free within ${this.deadlineMs} ms`,
          ),
        });
      }, this.deadlineMs);
      const resolve = (outcome: CheckoutOutcome) => {
        clearTimeout(deadline);
        settle(outcome);
      };
      this.dispatcher.dispatch(
        {
          origin: url.origin,
          path: url.path,
          method: 'POST',
          headers: {
            ...request.headers,
            'content-type': 'application/json',
            accept: 'application/json',
            authorization: `Bearer ${request.accessToken}`,
            'user-agent': this.userAgent,
          },
          body: request.body,
          headersTimeout: this.settings.headersTimeoutMs,
          bodyTimeout: this.settings.bodyTimeoutMs,
        },
        {
          // Its presence tells undici this handler speaks the current (controller) interface.
          // Called before the first byte is written, so aborting here sends nothing.
          onRequestStart: (started) => {
            inFlight = started;
            if (expired) started.abort(expired);
          },
          onResponseStart: (_controller, statusCode, responseHeaders) => {
            // Called again after a 1xx: only the final answer counts.
            status = statusCode;
            headers = responseHeaders;
            chunks = [];
            size = 0;
          },
          onResponseData: (controller, chunk) => {
            size += chunk.length;
            if (size > limit) {
              tooLarge = true;
              chunks = [];
              controller.abort(new Error('response body over the limit'));
              return;
            }
            chunks.push(chunk);
          },
          onResponseEnd: () =>
            resolve({
              kind: 'answered',
              status,
              contentType: firstHeader(headers['content-type']),
              retryAfter: firstHeader(headers['retry-after']),
              body: chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size),
            }),
          onResponseError: (_controller, cause) => {
            if (tooLarge) {
              resolve({
                kind: 'failed',
                delivered: 'maybe',
                error: new ProviderException(
                  ProviderErrorCode.MalformedResponse,
                  `${what()}: the provider answered HTTP ${status} with a body over ${limit} bytes (ORDERS_MAX_RESPONSE_BYTES)`,
                  { status },
                ),
              });
              return;
            }
            resolve({
              kind: 'failed',
              // Once an answer started, the request certainly reached the provider.
              delivered: status === 0 && wasNeverSent(cause) ? 'no' : 'maybe',
              error: translateTransportError(cause, what()),
            });
          },
        },
      );
    });
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }

  /** `{base_url}{ordersPath}` split for undici, parsed once per client. */
  private targetOf(client: ClientConfig): { origin: string; path: string } {
    let target = this.targets.get(client.id);
    if (!target) {
      const url = new URL(`${client.baseUrl}${client.ordersPath}`);
      target = { origin: url.origin, path: `${url.pathname}${url.search}` };
      this.targets.set(client.id, target);
    }
    return target;
  }
}

/** Whether `cause` certainly happened before any byte of the request was written. */
export function wasNeverSent(cause: unknown): boolean {
  if (cause instanceof undiciErrors.ConnectTimeoutError) return true;
  const code = (cause as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' && CONNECT_ERROR_CODES.has(code);
}

function firstHeader(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}
