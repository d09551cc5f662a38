import type { IncomingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import type { ClientConfig } from '../config/client.schema';
import { ordersCallDeadlineMs, type OrdersSettings } from '../config/config.schema';
import { trimTrailingSlashes } from '../config/schema-parts';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import { translateTransportError } from './provider-http';
import { Agent, type Dispatcher, errors as undiciErrors } from 'undici';

/** One provider call, as `POST /orders` or the passthrough hands it over. */
export interface ApiRequest {
  readonly client: ClientConfig;
  readonly accessToken: string;
  readonly method: string;
  /** Path and query below `{base_url}`: the client's orders path, or the caller's, checked. */
  readonly target: string;
  /** Headers to pass on, names lowercased; the adapter adds `Accept`, the bearer token and its user agent. */
  readonly headers: Readonly<Record<string, string>>;
  /** The request body (bounded by the route), or none. */
  readonly body?: Buffer;
  /** The answer's body is cut off (the stream errors) past this many bytes. */
  readonly maxResponseBytes: number;
  /** The setting named when the answer is over `maxResponseBytes`. */
  readonly limitSetting: string;
  /** Collect the answer whole, whatever its size, rather than stream a large one. */
  readonly whole?: boolean;
}

/**
 * Answers announcing at most this many bytes (`Content-Length`) are read whole: one write to
 * the caller with its length, and no stream machinery per answer. Larger or unannounced
 * answers stream.
 */
const SMALL_ANSWER_BYTES = 64 * 1024;

/** The provider's answer, whatever its status; its body streams unless small. */
export interface ApiAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  /**
   * A small answer whole, or the body as it arrives: that stream errors with a
   * {@link ProviderException} past `maxResponseBytes`, or when the provider stops sending; the
   * consumer must read it to the end or destroy it.
   */
  readonly body: Buffer | Readable;
}

/**
 * The call failed. `delivered` is what decides whether the request may have been acted on:
 * `no` only when no byte can have reached the provider (no connection was made); otherwise
 * `maybe`.
 */
export interface ApiFailure {
  readonly kind: 'failed';
  readonly delivered: 'no' | 'maybe';
  readonly error: ProviderException;
}

export type ApiOutcome = ApiAnswer | ApiFailure;

/** The provider's APIs under `{base_url}`, for `POST /orders` and the passthrough. */
export interface ProviderApiGateway {
  /** Sends once. Never throws for a transport failure: see {@link ApiFailure}. */
  call(request: ApiRequest): Promise<ApiOutcome>;
}

/**
 * Errors raised while connecting: the request was never written, so it cannot have been acted
 * on. Anything later (reset, timeout, a socket closed mid-exchange) may have.
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
 * The keep-alive pool for the provider's APIs. Its own pool, not the token endpoint's: the auth
 * server usually shares the host, and a slow API holding every connection must never delay a
 * token refresh. Its own connect timeout too (`orders.connectTimeoutMs`).
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
function wasNeverSent(cause: unknown): boolean {
  if (cause instanceof undiciErrors.ConnectTimeoutError) return true;
  const code = (cause as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' && CONNECT_ERROR_CODES.has(code);
}

/**
 * The one HTTP client of the provider's APIs under `{base_url}`, for `POST /orders` and the
 * passthrough alike, on the checkout pool and timeouts (`ORDERS_*`).
 *
 * It never retries: a request that may have reached the provider must not be sent twice, and
 * the one safe retry (after a 401, which the provider refused) is the caller's decision.
 */
export class ProviderApiClient implements ProviderApiGateway {
  private readonly origins = new Map<string, { origin: string; base: string }>();

  private readonly deadlineMs: number;

  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly settings: OrdersSettings,
    private readonly userAgent = 'token-broker',
  ) {
    this.deadlineMs = ordersCallDeadlineMs(settings);
  }

  /**
   * Undici's `dispatch` with a handler rather than `request`: a small answer is collected into
   * one buffer as it arrives, with no body stream and no promise per chunk, and the handler
   * knows whether the request was ever written (see {@link ApiFailure}).
   */
  call(request: ApiRequest): Promise<ApiOutcome> {
    const base = this.baseOf(request.client);
    const what = `${request.method} request for client "${request.client.id}"`;
    return new Promise((settle) => {
      const handler = new ExchangeHandler(request, what, this.deadlineMs, settle);
      this.dispatcher.dispatch(
        {
          origin: base.origin,
          path: `${base.base}${request.target}`,
          method: request.method,
          headers: {
            ...request.headers,
            accept: request.headers.accept ?? 'application/json',
            authorization: `Bearer ${request.accessToken}`,
            'user-agent': this.userAgent,
          },
          body: request.body,
          headersTimeout: this.settings.headersTimeoutMs,
          bodyTimeout: this.settings.bodyTimeoutMs,
        },
        handler,
      );
    });
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }

  /** `{base_url}` split into origin and base path (a base URL may carry a path), once per client. */
  private baseOf(client: ClientConfig): { origin: string; base: string } {
    let base = this.origins.get(client.id);
    if (!base) {
      const url = new URL(client.baseUrl);
      base = { origin: url.origin, base: trimTrailingSlashes(url.pathname) };
      this.origins.set(client.id, base);
    }
    return base;
  }
}

/**
 * One call in flight, as undici's handler: the answer collected whole or streamed, and the
 * call's one deadline.
 */
class ExchangeHandler implements Dispatcher.DispatchHandler {
  private status = 0;
  private headers: IncomingHttpHeaders = {};
  private chunks: Buffer[] = [];
  private size = 0;
  private tooLarge: ProviderException | undefined;
  private stream: Readable | undefined;
  private inFlight: Dispatcher.DispatchController | undefined;
  private expired: Error | undefined;
  private readonly limit: number;
  private readonly deadline: ReturnType<typeof setTimeout>;

  constructor(
    private readonly request: ApiRequest,
    private readonly what: string,
    private readonly deadlineMs: number,
    private readonly settle: (outcome: ApiOutcome) => void,
  ) {
    this.limit = request.maxResponseBytes;
    // The one deadline of the whole call, body included: undici's body timeout is an idle
    // timer, which a provider sending a byte now and then never trips.
    this.deadline = setTimeout(() => this.expire(), deadlineMs);
  }

  // Its presence tells undici this handler speaks the current (controller) interface.
  // Called before the first byte is written, so aborting here sends nothing.
  onRequestStart(started: Dispatcher.DispatchController): void {
    this.inFlight = started;
    if (this.expired) started.abort(this.expired);
  }

  onResponseStart(
    controller: Dispatcher.DispatchController,
    statusCode: number,
    responseHeaders: IncomingHttpHeaders,
  ): void {
    // Called again after a 1xx: only the final answer counts.
    this.status = statusCode;
    this.headers = responseHeaders;
    this.chunks = [];
    this.size = 0;
    const announced = Number(firstHeader(responseHeaders['content-length']));
    if (this.request.whole || announced <= Math.min(SMALL_ANSWER_BYTES, this.limit)) return;
    this.stream = new Readable({
      read: () => controller.resume(),
      // The consumer gone (or done with it): stop the transfer.
      destroy: (err, done) => {
        clearTimeout(this.deadline);
        if (!controller.aborted) controller.abort(err ?? new Error('answer not read'));
        done(err);
      },
    });
    this.resolve({
      kind: 'answered',
      status: this.status,
      headers: this.headers,
      body: this.stream,
    });
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.size += chunk.length;
    if (this.size > this.limit) {
      this.tooLarge = new ProviderException(
        ProviderErrorCode.MalformedResponse,
        `${this.what}: the provider answered HTTP ${this.status} with a body over ${this.limit} bytes (${this.request.limitSetting})`,
        { status: this.status },
      );
      this.chunks = [];
      controller.abort(this.tooLarge);
      return;
    }
    if (!this.stream) this.chunks.push(chunk);
    else if (!this.stream.push(chunk)) controller.pause();
  }

  onResponseEnd(): void {
    if (this.stream) {
      clearTimeout(this.deadline);
      this.stream.push(null);
      return;
    }
    this.resolve({
      kind: 'answered',
      status: this.status,
      headers: this.headers,
      body: this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks, this.size),
    });
  }

  onResponseError(_controller: Dispatcher.DispatchController, cause: Error): void {
    if (this.stream) {
      clearTimeout(this.deadline);
      this.stream.destroy(
        this.tooLarge ??
          (cause instanceof DOMException ? cause : translateTransportError(cause, this.what)),
      );
      return;
    }
    this.resolve({
      kind: 'failed',
      // Once an answer started, the request certainly reached the provider.
      delivered: this.status === 0 && wasNeverSent(cause) ? 'no' : 'maybe',
      error: this.tooLarge ?? translateTransportError(cause, this.what),
    });
  }

  /** The deadline passed: abort the call in flight, or fail it while still queued. */
  private expire(): void {
    const message = `${this.what}: the provider did not answer in full within ${this.deadlineMs} ms`;
    // A stream fails as `AbortSignal.timeout` would fail it; a collected answer is a failure.
    this.expired = this.stream
      ? new DOMException(message, 'TimeoutError')
      : new ProviderException(ProviderErrorCode.Timeout, message);
    if (this.inFlight) {
      this.inFlight.abort(this.expired);
      return;
    }
    // Still queued for a connection: nothing was written, and nothing will be.
    this.resolve({
      kind: 'failed',
      delivered: 'no',
      error: new ProviderException(
        ProviderErrorCode.Timeout,
        `${this.what}: no connection to the provider came free within ${this.deadlineMs} ms`,
      ),
    });
  }

  private resolve(outcome: ApiOutcome): void {
    if (!this.stream) clearTimeout(this.deadline);
    this.settle(outcome);
  }
}

function firstHeader(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}
