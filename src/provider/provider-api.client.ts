import type { IncomingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import { type ClientConfig, presentsCertificate } from '../config/client.schema';
import { ordersCallDeadlineMs, type OrdersSettings } from '../config/config.schema';
import { trimTrailingSlashes } from '../config/schema-parts';
import { type DpopSigner, nonceOf } from '../dpop/dpop-proofs';
import type { ClientCredentials } from '../secrets/client-credentials';
import { SecretsException } from '../secrets/secrets.exception';
import { ClientAgents, probeCertificateRefusal, tlsSettingNames } from './client-tls';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import {
  Agent,
  type ClientTlsOptions,
  closedBeforeAnswer,
  failedToConnect,
  type TlsSettingNames,
  tlsMisconfigured,
  translateTransportError,
} from './provider-http';
import type { Dispatcher } from 'undici';

/** One provider call, as `POST /orders` or the passthrough hands it over. */
export interface ApiRequest {
  readonly client: ClientConfig;
  readonly accessToken: string;
  readonly method: string;
  /** Path and query below `{base_url}`: the client's orders path, or the caller's, checked. */
  readonly target: string;
  /**
   * Names lowercased; the adapter adds `Accept`, `Accept-Encoding: identity`, the bearer token and
   * its user agent.
   */
  readonly headers: Readonly<Record<string, string>>;
  /** Bounded by the route. */
  readonly body?: Buffer;
  /** Past it the body is cut off (the stream errors). */
  readonly maxResponseBytes: number;
  /** Named when the answer is over `maxResponseBytes`. */
  readonly limitSetting: string;
  /** Collect the answer whole, whatever its size, rather than stream a large one. */
  readonly whole?: boolean;
}

/** Read whole up to this announced size: one write to the caller, no stream machinery. */
const SMALL_ANSWER_BYTES = 64 * 1024;

export interface ApiAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  /**
   * A small answer whole, or a stream that errors past `maxResponseBytes` or when the provider
   * stops sending; the consumer must read it to the end or destroy it.
   */
  readonly body: Buffer | Readable;
}

/** `delivered: 'no'` only when no byte can have reached the provider; otherwise `maybe`. */
export interface ApiFailure {
  readonly kind: 'failed';
  readonly delivered: 'no' | 'maybe';
  readonly error: ProviderException;
}

export type ApiOutcome = ApiAnswer | ApiFailure;

export interface ProviderApiGateway {
  /** Sends once. Never throws for a transport failure: see {@link ApiFailure}. */
  call(request: ApiRequest): Promise<ApiOutcome>;
}

/**
 * Its own pool, not the token endpoint's: the auth server usually shares the host, and a slow API
 * holding every connection must never delay a token refresh.
 */
export function createCheckoutAgent(settings: OrdersSettings, clientTls?: ClientTlsOptions): Agent {
  return new Agent({
    connect: { timeout: settings.connectTimeoutMs, ...clientTls },
    headersTimeout: settings.headersTimeoutMs,
    bodyTimeout: settings.bodyTimeoutMs,
    keepAliveTimeout: 30_000,
    keepAliveMaxTimeout: 60_000,
    connections: 128,
  });
}

/**
 * The certificate a mutual-TLS client presents to its API: the one it was last granted a token
 * with on this replica (the token is bound to it, RFC 8705 §3), else its credentials as read
 * from their source, re-read every `maxAgeMs` like the token side's (a replica that only adopted
 * the fleet's tokens never requested one).
 */
export class ClientCertificates {
  private readonly known = new Map<string, { credentials: ClientCredentials; at: number }>();
  private readonly reading = new Map<string, Promise<ClientCredentials>>();

  constructor(
    private readonly load: (client: ClientConfig) => Promise<ClientCredentials>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  granted(client: ClientConfig, credentials: ClientCredentials): void {
    this.known.set(client.id, { credentials, at: this.now() });
  }

  /** Through a source failure the last known ones are kept; throws when there are none. */
  async get(client: ClientConfig): Promise<ClientCredentials> {
    const known = this.known.get(client.id);
    if (known && this.now() - known.at < this.maxAgeMs) return known.credentials;
    let reading = this.reading.get(client.id);
    if (!reading) {
      reading = this.load(client).finally(() => this.reading.delete(client.id));
      this.reading.set(client.id, reading);
    }
    try {
      const credentials = await reading;
      // A grant meanwhile is newer than what was read.
      if (this.known.get(client.id) === known) {
        this.known.set(client.id, { credentials, at: this.now() });
      }
      return this.known.get(client.id)!.credentials;
    } catch (err) {
      if (known) return known.credentials;
      throw err;
    }
  }
}

/**
 * For `POST /orders` and the passthrough alike. It never retries: a request that may have reached
 * the provider must not be sent twice; the one safe retry (after a 401) is the caller's decision.
 * A mutual-TLS client's calls go on an agent of its own that presents its certificate (so the
 * provider's certificate-bound tokens are accepted), as does a client with a `caFile`.
 */
export class ProviderApiClient implements ProviderApiGateway {
  /** By the client's configuration object: a reload that changes `baseUrl` replaces it. */
  private readonly origins = new WeakMap<ClientConfig, { origin: string; base: string }>();
  /** One deadline for the whole call, fixed by the settings. */
  private readonly deadlineMs: number;
  private readonly agents: ClientAgents;

  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly settings: OrdersSettings,
    private readonly userAgent = 'token-broker',
    private readonly certificates?: ClientCertificates,
    caMaxAgeMs = 60_000,
    /** Signs a fresh proof per call for clients with `dpop` settings. */
    private readonly dpop?: DpopSigner,
  ) {
    this.deadlineMs = ordersCallDeadlineMs(settings);
    this.agents = new ClientAgents((options) => createCheckoutAgent(settings, options), caMaxAgeMs);
  }

  call(request: ApiRequest): Promise<ApiOutcome> {
    const { client } = request;
    const what = `${request.method} request for client "${client.id}"`;
    const mutual =
      client.tokenRequest.grant === 'rfc6749' && presentsCertificate(client.tokenRequest.auth);
    if (!mutual && client.caFile === undefined) {
      return this.exchange(this.dispatcher, request, what, undefined);
    }
    const names = tlsSettingNames(client);
    return this.ownDispatcher(client, mutual, what).then(
      async (dispatcher) => {
        const outcome = await this.exchange(dispatcher, request, what, names);
        return mutual ? this.diagnosed(client, outcome, what, names) : outcome;
      },
      (err: unknown) => ({ kind: 'failed', delivered: 'no', error: this.setUpFailure(err, what) }),
    );
  }

  /** A connection closed before any answer may be the certificate refused: ask the server. */
  private async diagnosed(
    client: ClientConfig,
    outcome: ApiOutcome,
    what: string,
    names: TlsSettingNames,
  ): Promise<ApiOutcome> {
    const options = this.agents.optionsOf(client.id);
    if (outcome.kind !== 'failed' || !options || !closedBeforeAnswer(outcome.error.cause)) {
      return outcome;
    }
    const how = await probeCertificateRefusal(
      client.baseUrl,
      options,
      this.settings.connectTimeoutMs,
    );
    if (how === undefined) return outcome;
    // Whether it was delivered is as the failed call left it: the probe is another connection.
    return { ...outcome, error: tlsMisconfigured('certificate', how, what, names, outcome.error) };
  }

  private async ownDispatcher(
    client: ClientConfig,
    mutual: boolean,
    what: string,
  ): Promise<Dispatcher> {
    if (mutual && this.certificates === undefined) {
      throw new ProviderException(
        ProviderErrorCode.Misconfigured,
        `${what}: no source of the client certificate is wired`,
      );
    }
    const credentials = mutual ? await this.certificates!.get(client) : undefined;
    return this.agents.agentFor(client, credentials, what) ?? this.dispatcher;
  }

  /** The certificate could not be read: nothing was sent. */
  private setUpFailure(err: unknown, what: string): ProviderException {
    if (err instanceof ProviderException) return err;
    if (err instanceof SecretsException) {
      return new ProviderException(
        err.transient ? ProviderErrorCode.Unreachable : ProviderErrorCode.Misconfigured,
        `${what}: cannot read the client certificate (${err.message})`,
        { cause: err },
      );
    }
    return translateTransportError(err, what);
  }

  /** On `dispatcher`, with the client's scheme: a bearer token, or DPoP with a proof. */
  private exchange(
    dispatcher: Dispatcher,
    request: ApiRequest,
    what: string,
    tls: TlsSettingNames | undefined,
  ): Promise<ApiOutcome> {
    if (request.client.dpop === undefined || this.dpop === undefined) {
      return this.send(dispatcher, request, what, tls, `Bearer ${request.accessToken}`);
    }
    return this.dpopCall(dispatcher, request, what, tls, this.dpop);
  }

  /**
   * RFC 9449 §7: `Authorization: DPoP` with a proof of this method and URL, the token's hash and
   * the API's last nonce. Its `use_dpop_nonce` 401 carries the new one and was answered before
   * the request was acted on, so the call goes once more with it; that 401 never reaches the
   * caller, nor counts as a refused token.
   */
  private async dpopCall(
    dispatcher: Dispatcher,
    request: ApiRequest,
    what: string,
    tls: TlsSettingNames | undefined,
    dpop: DpopSigner,
  ): Promise<ApiOutcome> {
    const base = this.baseOf(request.client);
    const url = `${base.origin}${base.base}${request.target}`;
    for (let attempt = 0; ; attempt++) {
      let proof: string;
      try {
        proof = await dpop.proof(request.client, {
          method: request.method,
          url,
          accessToken: request.accessToken,
          server: 'rs',
        });
      } catch (cause) {
        const message = `${what}: cannot sign the DPoP proof: ${cause instanceof Error ? cause.message : 'error'}`;
        const error = new ProviderException(ProviderErrorCode.Rejected, message, { cause });
        return { kind: 'failed', delivered: 'no', error };
      }
      const outcome = await this.send(
        dispatcher,
        request,
        what,
        tls,
        `DPoP ${request.accessToken}`,
        proof,
      );
      if (outcome.kind !== 'answered') return outcome;
      const nonce = nonceOf(outcome.headers['dpop-nonce']);
      if (nonce === undefined) return outcome;
      await dpop.learn(request.client, 'rs', url, nonce);
      if (attempt > 0 || outcome.status !== 401 || !asksForNonce(outcome.headers)) return outcome;
      if (!Buffer.isBuffer(outcome.body)) outcome.body.destroy();
    }
  }

  /**
   * `dispatch` with a handler rather than `request`: a small answer is collected into one buffer,
   * with no body stream or promise per chunk, and the handler knows whether a byte was written.
   */
  private send(
    dispatcher: Dispatcher,
    request: ApiRequest,
    what: string,
    tls: TlsSettingNames | undefined,
    authorization: string,
    dpop?: string,
  ): Promise<ApiOutcome> {
    const base = this.baseOf(request.client);
    return new Promise((settle) => {
      const handler = new ExchangeHandler(request, what, this.deadlineMs, settle, tls);
      dispatcher.dispatch(
        {
          origin: base.origin,
          path: `${base.base}${request.target}`,
          method: request.method,
          headers: {
            ...request.headers,
            accept: request.headers.accept ?? 'application/json',
            // The answer is screened for the token and relayed as read: never a compressed one.
            'accept-encoding': 'identity',
            authorization,
            ...(dpop !== undefined && { dpop }),
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
    await Promise.all([this.dispatcher.close(), this.agents.close()]);
  }

  /** A base URL may carry a path; split once per client. */
  private baseOf(client: ClientConfig): { origin: string; base: string } {
    let base = this.origins.get(client);
    if (!base) {
      const url = new URL(client.baseUrl);
      base = { origin: url.origin, base: trimTrailingSlashes(url.pathname) };
      this.origins.set(client, base);
    }
    return base;
  }
}

/** RFC 9449 §9: `WWW-Authenticate: DPoP error="use_dpop_nonce"`. */
export function asksForNonce(
  headers: Readonly<Record<string, string | string[] | undefined>>,
): boolean {
  const challenge = headers['www-authenticate'];
  const values: string[] = Array.isArray(challenge)
    ? challenge
    : challenge === undefined
      ? []
      : [challenge];
  return values.some((v) => /^\s*DPoP\b/i.test(v) && /error\s*=\s*"?use_dpop_nonce"?/i.test(v));
}

/** One call in flight: the answer collected whole or streamed, and the call's one deadline. */
class ExchangeHandler implements Dispatcher.DispatchHandler {
  private status = 0;
  private headers: IncomingHttpHeaders = {};
  private chunks: Buffer[] = [];
  private size = 0;
  private tooLarge: ProviderException | undefined;
  private stream: Readable | undefined;
  private inFlight: Dispatcher.DispatchController | undefined;
  private expired: Error | undefined;
  private readonly deadline: ReturnType<typeof setTimeout>;

  constructor(
    private readonly request: ApiRequest,
    private readonly what: string,
    private readonly deadlineMs: number,
    private readonly settle: (outcome: ApiOutcome) => void,
    private readonly tls?: TlsSettingNames,
  ) {
    // One deadline for the whole call: undici's body timeout is an idle timer a trickle evades.
    this.deadline = setTimeout(() => this.expire(), deadlineMs);
  }

  // Its presence tells undici this handler speaks the controller interface; called before the
  // first byte is written, so aborting here sends nothing.
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
    const length = responseHeaders['content-length'];
    const announced = Number(Array.isArray(length) ? length[0] : length);
    const limit = this.request.maxResponseBytes;
    if (this.request.whole || announced <= Math.min(SMALL_ANSWER_BYTES, limit)) return;
    this.stream = new Readable({
      read: () => controller.resume(),
      // The consumer gone (or done with it): stop the transfer.
      destroy: (err, done) => {
        clearTimeout(this.deadline);
        if (!controller.aborted) controller.abort(err ?? new Error('answer not read'));
        done(err);
      },
    });
    this.answer(this.stream);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.size += chunk.length;
    const limit = this.request.maxResponseBytes;
    if (this.size > limit) {
      this.tooLarge = new ProviderException(
        ProviderErrorCode.MalformedResponse,
        `${this.what}: the provider answered HTTP ${this.status} with a body over ${limit} bytes (${this.request.limitSetting})`,
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
    this.answer(this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks, this.size));
  }

  onResponseError(_controller: Dispatcher.DispatchController, cause: Error): void {
    if (this.stream) {
      clearTimeout(this.deadline);
      this.stream.destroy(
        this.tooLarge ??
          (cause instanceof DOMException
            ? cause
            : translateTransportError(cause, this.what, this.tls)),
      );
      return;
    }
    this.resolve({
      kind: 'failed',
      // Once an answer started, the request certainly reached the provider.
      delivered: this.status === 0 && failedToConnect(cause) ? 'no' : 'maybe',
      error: this.tooLarge ?? translateTransportError(cause, this.what, this.tls),
    });
  }

  /** Abort the call in flight, or fail it while still queued. */
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

  private answer(body: Buffer | Readable): void {
    this.resolve({ kind: 'answered', status: this.status, headers: this.headers, body });
  }

  private resolve(outcome: ApiOutcome): void {
    if (!this.stream) clearTimeout(this.deadline);
    this.settle(outcome);
  }
}
