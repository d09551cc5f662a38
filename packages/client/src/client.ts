import { randomUUID } from 'node:crypto';
import { Credential, type CredentialSource } from './credentials';
import { BrokerError, brokerError, type BrokerErrorCode } from './errors';

/** How to reach the broker and how hard to try. */
export type BrokerClientOptions = CredentialSource & {
  /** The broker's URL, e.g. `http://token-broker.shop.svc`. */
  baseUrl: string;
  /**
   * Lifetime kept in reserve: a cached token is handed out only while it has more than
   * `minTtl` plus this left (capped at a quarter of the token's lifetime, for short tokens).
   * @default 5_000
   */
  expiryMarginMs?: number;
  /**
   * Refresh in the background once a token is this close to the reserve, so callers never
   * wait. At most one such request a second per client.
   * @default half the token's lifetime, at most 60_000
   */
  refreshAheadMs?: number;
  /** Tries per request (the first included) for answers worth retrying. @default 4 */
  maxAttempts?: number;
  /** First backoff; doubled per retry, with jitter. `Retry-After` waits longer if it says so. @default 100 */
  retryBaseMs?: number;
  /** Longest single wait between tries; a longer `Retry-After` ends the retries. @default 5_000 */
  retryMaxMs?: number;
  /** Per-request timeout. @default 5_000 */
  requestTimeoutMs?: number;
  /** Called with every failed background refresh (the cached token is still served). */
  onBackgroundError?: (err: BrokerError) => void;
};

/** A provider token as the caller uses it. */
export interface BrokerToken {
  accessToken: string;
  tokenType: 'Bearer';
  /** Local clock, conservative: the broker's remaining lifetime counted from the request. */
  expiresAt: Date;
}

export interface GetTokenOptions {
  /** The provider client (a configured client id, e.g. `acme-prod`). */
  client: string;
  /** Seconds the token must stay valid at least. @default 0 */
  minTtl?: number;
}

export interface CreateOrderOptions {
  client: string;
  /** Reused across this call's own retries; a new UUID when not given. */
  idempotencyKey?: string;
}

/** The provider's answer to an order, forwarded by the broker. */
export interface OrderResult<T = unknown> {
  /** The provider's status (2xx, or its own 4xx answer). */
  status: number;
  body: T;
  /** The key sent: keep it to retry the same order later. */
  idempotencyKey: string;
  /** The broker replayed the stored answer of an earlier request with this key. */
  replayed: boolean;
  requestId?: string;
}

export interface BrokerClient {
  getToken(opts: GetTokenOptions): Promise<BrokerToken>;
  orders: {
    create<T = unknown>(body: unknown, opts: CreateOrderOptions): Promise<OrderResult<T>>;
  };
}

interface Held {
  token: BrokerToken;
  expiresAtMs: number;
}

interface Entry {
  held?: Held;
  /** The longest lifetime seen for this client's tokens: scales the margin and lead. */
  spanMs: number;
  lastBackgroundAt: number;
}

const IDEMPOTENCY_KEY = /^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/;

/**
 * A client for the token broker: `getToken` with a local cache, single flight, refresh ahead
 * and retries; `orders.create` with an `Idempotency-Key` on every order. No runtime
 * dependency: Node's global `fetch`.
 */
export function createBrokerClient(options: BrokerClientOptions): BrokerClient {
  return new Client(options);
}

class Client implements BrokerClient {
  private readonly baseUrl: string;
  private readonly credential: Credential;
  private readonly entries = new Map<string, Entry>();
  private readonly inflight = new Map<string, Promise<Held>>();
  private readonly maxAttempts: number;
  private readonly retryBaseMs: number;
  private readonly retryMaxMs: number;
  private readonly requestTimeoutMs: number;

  readonly orders: BrokerClient['orders'] = {
    create: (body, opts) => this.createOrder(body, opts),
  };

  constructor(private readonly options: BrokerClientOptions) {
    let url: URL;
    try {
      url = new URL(options.baseUrl);
    } catch {
      // The value is not echoed: a mistyped URL may still hold a password.
      throw new TypeError('baseUrl must be an absolute http(s) URL, such as http://token-broker');
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      throw new TypeError(`baseUrl must be http: or https:, got ${url.protocol}`);
    }
    // A user name or password in baseUrl would end up in every error message naming it; the
    // broker authenticates callers by apiKey or service-account token, never by URL userinfo.
    if (url.username !== '' || url.password !== '') {
      throw new TypeError(
        'baseUrl must not contain a user name or password: give the API key as apiKey',
      );
    }
    this.baseUrl = trimTrailingSlashes(url.href);
    if ('apiKey' in options && 'serviceAccountTokenFile' in options) {
      throw new TypeError('give apiKey or serviceAccountTokenFile, not both');
    }
    this.credential = new Credential(options);
    this.maxAttempts = positive(options.maxAttempts, 4, 'maxAttempts');
    this.retryBaseMs = positive(options.retryBaseMs, 100, 'retryBaseMs');
    this.retryMaxMs = positive(options.retryMaxMs, 5_000, 'retryMaxMs');
    this.requestTimeoutMs = positive(options.requestTimeoutMs, 5_000, 'requestTimeoutMs');
    positive(options.expiryMarginMs, 5_000, 'expiryMarginMs', true);
    positive(options.refreshAheadMs, 0, 'refreshAheadMs', true);
  }

  async getToken({ client, minTtl = 0 }: GetTokenOptions): Promise<BrokerToken> {
    if (typeof client !== 'string' || client === '') {
      throw new TypeError('getToken: client must be a non-empty string');
    }
    if (typeof minTtl !== 'number' || !Number.isFinite(minTtl) || minTtl < 0) {
      throw new TypeError('getToken: minTtl must be a number of seconds >= 0');
    }
    const entry = this.entry(client);
    const needMs = minTtl * 1000 + this.marginMs(entry);
    const held = entry.held;
    if (held) {
      const left = held.expiresAtMs - Date.now();
      if (left > needMs) {
        if (left <= needMs + this.aheadMs(entry)) this.refreshInBackground(client, entry);
        return held.token;
      }
    }
    // A token still valid for what the caller asked (the margin aside) is the fallback, so
    // one try only: it is served at once if the broker cannot answer.
    const fallback = held && held.expiresAtMs - Date.now() > minTtl * 1000 ? held : undefined;
    try {
      const fresh = await this.refresh(client, minTtl, fallback ? 1 : this.maxAttempts);
      if (fresh.expiresAtMs - Date.now() > minTtl * 1000) return fresh.token;
      throw brokerError({
        code: 'token_unavailable',
        status: 503,
        message: `the broker's token for ${client} has less than minTtl=${minTtl}s left`,
      });
    } catch (err) {
      const still = entry.held;
      if (still && still.expiresAtMs - Date.now() > minTtl * 1000) return still.token;
      throw err;
    }
  }

  private entry(client: string): Entry {
    let entry = this.entries.get(client);
    if (!entry) {
      entry = { spanMs: 0, lastBackgroundAt: -Infinity };
      this.entries.set(client, entry);
    }
    return entry;
  }

  private marginMs(entry: Entry): number {
    return Math.min(this.options.expiryMarginMs ?? 5_000, entry.spanMs / 4);
  }

  private aheadMs(entry: Entry): number {
    return this.options.refreshAheadMs ?? Math.min(60_000, entry.spanMs / 2);
  }

  private refreshInBackground(client: string, entry: Entry): void {
    const now = Date.now();
    if (this.inflight.has(key(client, 0)) || now - entry.lastBackgroundAt < 1000) return;
    entry.lastBackgroundAt = now;
    this.refresh(client, 0, 1).catch((err: unknown) => {
      if (err instanceof BrokerError) this.options.onBackgroundError?.(err);
    });
  }

  /** One request (and its retries) per client and `minTtl` at a time; the rest share it. */
  private refresh(client: string, minTtl: number, attempts: number): Promise<Held> {
    const k = key(client, minTtl);
    const running = this.inflight.get(k);
    if (running) return running;
    const run = this.withRetries(attempts, () => this.requestToken(client, minTtl))
      .then((held) => {
        const entry = this.entry(client);
        entry.spanMs = Math.max(entry.spanMs, held.expiresAtMs - Date.now());
        if (!entry.held || held.expiresAtMs >= entry.held.expiresAtMs) entry.held = held;
        return held;
      })
      .finally(() => this.inflight.delete(k));
    this.inflight.set(k, run);
    return run;
  }

  private async requestToken(client: string, minTtl: number): Promise<Held> {
    const query = new URLSearchParams({ client });
    if (minTtl > 0) query.set('min_ttl', String(Math.ceil(minTtl)));
    const sentAt = Date.now();
    const res = await this.send(`/token?${query.toString()}`, { method: 'GET' });
    if (res.status !== 200) throw await problemOf(res);
    const body = (await res.json().catch(() => undefined)) as
      | { access_token?: unknown; expires_in?: unknown }
      | undefined;
    if (
      typeof body?.access_token !== 'string' ||
      body.access_token === '' ||
      typeof body.expires_in !== 'number' ||
      !(body.expires_in >= 0)
    ) {
      throw brokerError({
        code: 'internal_error',
        status: res.status,
        message: 'the broker answered 200 without access_token and expires_in',
        requestId: res.headers.get('x-request-id') ?? undefined,
      });
    }
    const expiresAtMs = sentAt + body.expires_in * 1000;
    return {
      token: {
        accessToken: body.access_token,
        tokenType: 'Bearer',
        expiresAt: new Date(expiresAtMs),
      },
      expiresAtMs,
    };
  }

  private async createOrder<T>(body: unknown, opts: CreateOrderOptions): Promise<OrderResult<T>> {
    if (typeof opts?.client !== 'string' || opts.client === '') {
      throw new TypeError('orders.create: client must be a non-empty string');
    }
    const idempotencyKey = opts.idempotencyKey ?? randomUUID();
    if (!IDEMPOTENCY_KEY.test(idempotencyKey)) {
      throw new TypeError(
        'orders.create: idempotencyKey must be 1-255 printable ASCII characters, not starting or ending with a space',
      );
    }
    const payload = typeof body === 'string' ? body : JSON.stringify(body);
    if (payload === undefined) throw new TypeError('orders.create: body must be JSON');
    return this.withRetries(this.maxAttempts, async () => {
      const res = await this.send(
        `/orders?${new URLSearchParams({ client: opts.client }).toString()}`,
        {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
          body: payload,
        },
      );
      if (isBrokerProblem(res)) throw await problemOf(res);
      const text = await res.text();
      let parsed: unknown = text;
      try {
        parsed = text === '' ? undefined : JSON.parse(text);
      } catch {
        // Not JSON: the provider's own text, given as is.
      }
      return {
        status: res.status,
        body: parsed as T,
        idempotencyKey,
        replayed: res.headers.get('idempotent-replayed') === 'true',
        requestId: res.headers.get('x-request-id') ?? undefined,
      };
    });
  }

  /**
   * Sends with the caller's credential. A 401 with a service-account token file re-reads the
   * file once and tries again (the kubelet may just have rotated it).
   */
  private async send(path: string, init: RequestInit): Promise<Response> {
    let res = await this.fetchOnce(path, init, await this.credential.value());
    if (res.status === 401 && this.credential.rotates) {
      await res.body?.cancel();
      res = await this.fetchOnce(path, init, await this.credential.value(true));
    }
    return res;
  }

  private async fetchOnce(path: string, init: RequestInit, credential: string): Promise<Response> {
    try {
      return await fetch(`${this.baseUrl}${path}`, {
        ...init,
        headers: {
          ...(init.headers as Record<string, string>),
          authorization: `Bearer ${credential}`,
        },
        signal: AbortSignal.timeout(this.requestTimeoutMs),
        // Following would resend the credential, and an order's body, to whatever origin the
        // answer names; the broker itself never redirects.
        redirect: 'error',
      });
    } catch (err) {
      // Duck-typed: fetch's errors come from another realm under test runners.
      if (causeMessage(err) === 'unexpected redirect') {
        throw brokerError({
          code: 'unexpected_redirect',
          status: 0,
          message: `${this.baseUrl} answered with a redirect, which the client never follows (it would resend the credential elsewhere): check baseUrl points at the broker itself`,
          cause: err,
        });
      }
      const timedOut = (err as { name?: unknown } | undefined)?.name === 'TimeoutError';
      throw brokerError({
        code: timedOut ? 'timeout' : 'network_error',
        status: 0,
        message: timedOut
          ? `no answer from the broker within ${this.requestTimeoutMs} ms`
          : `cannot reach the broker at ${this.baseUrl}: ${causeCode(err)}`,
        cause: err,
      });
    }
  }

  /** Exponential backoff with jitter, at least the broker's `Retry-After`. */
  private async withRetries<T>(attempts: number, once: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await once();
      } catch (err) {
        const e = err;
        if (!(e instanceof BrokerError) || !e.retryable || attempt >= attempts) throw e;
        const backoff = Math.min(this.retryMaxMs, this.retryBaseMs * 2 ** (attempt - 1));
        const wait = Math.max(backoff * (0.5 + Math.random() / 2), e.retryAfterMs ?? 0);
        if (wait > this.retryMaxMs) throw e;
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }
  }
}

function key(client: string, minTtl: number): string {
  return `${client}\0${minTtl}`;
}

function positive(
  value: number | undefined,
  fallback: number,
  name: string,
  zeroOk = false,
): number {
  if (value === undefined) return fallback;
  if (
    typeof value !== 'number' ||
    !Number.isFinite(value) ||
    value < 0 ||
    (!zeroOk && value === 0)
  ) {
    throw new TypeError(`${name} must be a ${zeroOk ? 'non-negative' : 'positive'} number`);
  }
  return value;
}

function isBrokerProblem(res: Response): boolean {
  return (res.headers.get('content-type') ?? '').startsWith('application/problem+json');
}

/** The broker's problem+json as a typed error (a body that is not one still gives the status). */
async function problemOf(res: Response): Promise<BrokerError> {
  const text = await res.text().catch(() => '');
  let problem: { code?: unknown; detail?: unknown } = {};
  try {
    problem = JSON.parse(text) as typeof problem;
  } catch {
    // Not JSON (a proxy's error page): the status decides.
  }
  const code =
    typeof problem.code === 'string' ? problem.code : (statusCode(res.status) as BrokerErrorCode);
  const retryAfter = Number(res.headers.get('retry-after'));
  return brokerError({
    code,
    status: res.status,
    message:
      typeof problem.detail === 'string' ? problem.detail : `the broker answered ${res.status}`,
    requestId: res.headers.get('x-request-id') ?? undefined,
    retryAfterMs: Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter * 1000 : undefined,
  });
}

function statusCode(status: number): string {
  if (status === 401) return 'unauthenticated';
  if (status === 403) return 'forbidden';
  if (status === 502 || status === 503 || status === 504) return 'network_error';
  return status >= 500 ? 'internal_error' : 'invalid_request';
}

function causeMessage(err: unknown): unknown {
  return (err as { cause?: { message?: unknown } } | undefined)?.cause?.message;
}

/** `value` without trailing slashes; a loop, since `/\/+$/` is quadratic in a run of slashes. */
function trimTrailingSlashes(value: string): string {
  let end = value.length;
  while (end > 0 && value.charCodeAt(end - 1) === 0x2f) end--;
  return value.slice(0, end);
}

function causeCode(err: unknown): string {
  const cause = (err as { cause?: { code?: unknown } } | undefined)?.cause;
  return typeof cause?.code === 'string' ? cause.code : 'connection failed';
}
