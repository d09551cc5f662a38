import type { IncomingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import type { ClientConfig } from '../config/client.schema';
import { ordersCallDeadlineMs, type OrdersSettings } from '../config/config.schema';
import { trimTrailingSlashes } from '../config/schema-parts';
import {
  type CheckoutFailure,
  type CheckoutGateway,
  type CheckoutOutcome,
  type CheckoutRequest,
  wasNeverSent,
} from './checkout.client';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import { translateTransportError } from './provider-http';

/** One provider call as the passthrough hands it over. */
export interface ApiRequest {
  readonly client: ClientConfig;
  readonly accessToken: string;
  readonly method: string;
  /** Path and query below `{base_url}`, checked and exactly as the caller sent them. */
  readonly target: string;
  /** Headers to pass on, names lowercased; the adapter adds `Accept`, the bearer token and its user agent. */
  readonly headers: Readonly<Record<string, string>>;
  /** The request body (bounded by the route), or none. */
  readonly body?: Buffer;
  /** The answer's body is cut off (the stream errors) past this many bytes. */
  readonly maxResponseBytes: number;
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

export type ApiOutcome = ApiAnswer | CheckoutFailure;

/** The provider's APIs (checkout and marketing) for the passthrough. */
export interface ProviderApiGateway {
  /** Sends once. Never throws for a transport failure: see {@link CheckoutFailure}. */
  call(request: ApiRequest): Promise<ApiOutcome>;
}

/** How one call is sent and its answer collected. */
interface Exchange extends ApiRequest {
  /** Collect the answer whole, whatever its size (orders), rather than stream a large one. */
  readonly whole: boolean;
  /** The setting named when the answer is over `maxResponseBytes`. */
  readonly limitSetting: string;
}

/**
 * The one HTTP client of the provider's APIs under `{base_url}`: the create-order call of
 * `POST /orders` ({@link createOrder}) and any passthrough call ({@link call}), on the checkout
 * pool and timeouts (`ORDERS_*`). Its own pool, not the token endpoint's: a slow API holding
 * every connection must never delay a token refresh.
 *
 * It never retries: a request that may have reached the provider must not be sent twice, and
 * the one safe retry (after a 401, which the provider refused) is the caller's decision.
 */
export class ProviderApiClient implements ProviderApiGateway, CheckoutGateway {
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
   * The provider's create-order call: `POST {base_url}{ordersPath}` with
   * `Content-Type: application/json`, `Accept: application/json` and the bearer token; the
   * body is passed through untouched and the answer collected whole.
   */
  async createOrder(request: CheckoutRequest): Promise<CheckoutOutcome> {
    const outcome = await this.exchange({
      client: request.client,
      accessToken: request.accessToken,
      method: 'POST',
      target: request.client.ordersPath,
      headers: {
        ...request.headers,
        'content-type': 'application/json',
        accept: 'application/json',
      },
      body: request.body,
      maxResponseBytes: this.settings.maxResponseBytes,
      whole: true,
      limitSetting: 'ORDERS_MAX_RESPONSE_BYTES',
    });
    if (outcome.kind === 'failed') return outcome;
    return {
      kind: 'answered',
      status: outcome.status,
      contentType: firstHeader(outcome.headers['content-type']),
      retryAfter: firstHeader(outcome.headers['retry-after']),
      body: outcome.body as Buffer,
    };
  }

  call(request: ApiRequest): Promise<ApiOutcome> {
    return this.exchange({
      ...request,
      whole: false,
      limitSetting: 'FORWARD_MAX_RESPONSE_BYTES',
    });
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }

  /**
   * Undici's `dispatch` with a handler rather than `request`: a small answer is collected into
   * one buffer as it arrives, with no body stream and no promise per chunk, and the handler
   * knows whether the request was ever written (see {@link CheckoutFailure}).
   */
  private exchange(request: Exchange): Promise<ApiOutcome> {
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
    private readonly request: Exchange,
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
