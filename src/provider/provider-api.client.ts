import type { IncomingHttpHeaders } from 'node:http';
import { pipeline, Transform, type Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import {
  type ClientConfig,
  ordersCallDeadlineMs,
  type OrdersSettings,
  trimTrailingSlashes,
} from '../config/config.schema';
import type { CheckoutFailure } from './checkout.client';
import { wasNeverSent } from './checkout.client';
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
 * the caller with its length, and no stream machinery per answer (a pipeline costs an abort
 * controller and several writes). Larger or unannounced answers stream.
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

/**
 * Any call under `{base_url}`, on the checkout API's pool and timeouts (`ORDERS_*`): the same
 * host, and the same "a slow API never delays a token refresh" reason for a pool of its own.
 * Bodies stream back through undici's `request` (nothing collected here); the size limit is a
 * counting transform in the pipeline. It never retries: that is the caller's decision.
 */
export class ProviderApiClient implements ProviderApiGateway {
  private readonly origins = new Map<string, { origin: string; base: string }>();

  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly settings: OrdersSettings,
    private readonly userAgent = 'token-broker',
  ) {}

  async call(request: ApiRequest): Promise<ApiOutcome> {
    const { client } = request;
    const base = this.baseOf(client);
    const what = () => `${request.method} request for client "${client.id}"`;
    let answer: Dispatcher.ResponseData;
    try {
      answer = await this.dispatcher.request({
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
        // Also ends a streamed body: one that trickles in never trips the idle timers.
        signal: AbortSignal.timeout(ordersCallDeadlineMs(this.settings)),
      });
    } catch (cause) {
      return {
        kind: 'failed',
        delivered: wasNeverSent(cause) ? 'no' : 'maybe',
        error: translateTransportError(cause, what()),
      };
    }
    const { statusCode: status, headers } = answer;
    const announced = Number(headers['content-length']);
    if (announced <= Math.min(SMALL_ANSWER_BYTES, request.maxResponseBytes)) {
      try {
        return {
          kind: 'answered',
          status,
          headers,
          body: Buffer.from(await answer.body.arrayBuffer()),
        };
      } catch (cause) {
        // The answer had started: the request certainly reached the provider.
        return {
          kind: 'failed',
          delivered: 'maybe',
          error: translateTransportError(cause, what()),
        };
      }
    }
    return {
      kind: 'answered',
      status,
      headers,
      // pipeline: an error either side (cut off, limit, the consumer gone) destroys both.
      body: pipeline(
        answer.body,
        capped(request.maxResponseBytes, status, what()),
        () => undefined,
      ),
    };
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

/** Passes bytes through, and fails past `limit`: a huge answer is cut, never held. */
function capped(limit: number, status: number, what: string): Transform {
  let size = 0;
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      size += chunk.length;
      if (size > limit) {
        done(
          new ProviderException(
            ProviderErrorCode.MalformedResponse,
            `${what}: the provider answered HTTP ${status} with a body over ${limit} bytes (FORWARD_MAX_RESPONSE_BYTES)`,
            { status },
          ),
        );
        return;
      }
      done(null, chunk);
    },
  });
}
