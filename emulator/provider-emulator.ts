import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  EmulatorHttpServer,
  mediaType,
  parseTarget,
  readBody,
  send,
  sendJson,
  type RequestBody,
} from './emulator-http-server';

/** The provider's token endpoint (below `{auth_url}`). */
export const PROVIDER_TOKEN_PATH = '/api/auth/v1/oauth/token';
/**
 * The provider's create-order paths (below `{base_url}`): the documented one, then the one the
 * provider's own plugin posts to.
 * Both are served so the broker's configurable orders path can be tested either way.
 */
export const PROVIDER_ORDERS_PATHS: readonly string[] = [
  '/api/checkout/v1/orders',
  '/api/flexpay/v1/orders',
];

/**
 * The API groups the emulator serves beyond orders, for the broker's passthrough: any path
 * below these echoes the call (see {@link EchoedCall}); `.../large?bytes=N` streams N bytes.
 */
export const PROVIDER_API_PREFIXES: readonly string[] = ['/api/marketing/v1/', '/api/checkout/v1/'];

/** Bodies past this are refused with 413: the emulator must not be the thing that runs out of memory. */
const MAX_BODY_BYTES = 2 * 1024 * 1024;

/** How to start a {@link ProviderEmulator}. */
export interface ProviderEmulatorOptions {
  /** TCP port; `0` or absent picks a free one. */
  port?: number;
  /** Interface to bind. @default '127.0.0.1' */
  host?: string;
  /** Accepted `client_id -> client_secret`; replace later with `setCredentials`. */
  credentials: Record<string, string>;
  /** Behaviour to start with; the rest are {@link DEFAULT_PROVIDER_KNOBS}. */
  knobs?: Partial<ProviderKnobs>;
}

/** Behaviour that tests change at run time with `setKnobs`. */
export interface ProviderKnobs {
  /**
   * Lifetime of issued tokens, which the orders endpoint enforces and `expires_in` reports.
   * Zero or negative issues tokens that are already expired.
   * @default 1800 (the provider's documented lifetime: 30 minutes)
   */
  tokenLifetimeSeconds: number;
  /**
   * How `expires_in` appears in the token response: a JSON number, a numeric string (seen in
   * the wild) or absent (the provider does not document it: optional).
   * @default 'number'
   */
  expiresIn: 'number' | 'string' | 'omit';
  /** `token_type` value; `null` omits it (the provider leaves it optional). @default 'Bearer' */
  tokenType: string | null;
  /** Delay before answering the token endpoint, failures included. @default 0 */
  tokenLatencyMs: number;
  /** Delay before answering the orders endpoints, failures included. @default 0 */
  ordersLatencyMs: number;
  /** When set, every token request fails this way (after one-shot failures). @default null */
  tokenFailure: TokenFailure | null;
  /** When set, every order request fails this way. @default null */
  ordersFailure: OrdersFailure | null;
  /** When set, every passthrough (non-order API) call fails this way, e.g. a 429. @default null */
  apiFailure: OrdersFailure | null;
  /**
   * How the echo of a passthrough call shows its `Authorization`: `redacted` (the bearer
   * token replaced; `stats.calls` keeps it), or the token itself as a careless debugging
   * endpoint would, in one write (`verbatim`) or in two with the token cut between them
   * (`split`). @default 'redacted'
   */
  echoAuthorization: 'redacted' | 'verbatim' | 'split';
  /**
   * Tokens granted per minute (sliding window) before the token endpoint answers 429 with
   * `Retry-After`, as an authorization server with a rate limit does; `0`: no limit.
   * @default 0
   */
  tokenGrantsPerMinute: number;
  /**
   * Hand a client the token it already holds, with what is left of its lifetime, until it
   * expires (as PayPal and several enterprise servers do), even after a revoke on this side.
   * @default false
   */
  reissueTokens: boolean;
}

/** The provider's behaviour when nothing is configured. */
export const DEFAULT_PROVIDER_KNOBS: Readonly<ProviderKnobs> = Object.freeze({
  tokenLifetimeSeconds: 1800,
  expiresIn: 'number',
  tokenType: 'Bearer',
  tokenLatencyMs: 0,
  ordersLatencyMs: 0,
  tokenFailure: null,
  ordersFailure: null,
  apiFailure: null,
  echoAuthorization: 'redacted',
  tokenGrantsPerMinute: 0,
  reissueTokens: false,
});

/** A way for the token endpoint to fail. Applied before credentials are checked. */
export type TokenFailure =
  /** Answer `status` with `body` (default empty); `retryAfter` sets `Retry-After`. */
  | { kind: 'status'; status: number; body?: string; contentType?: string; retryAfter?: string }
  /** Read the request and never answer, until `close()`. */
  | { kind: 'timeout' }
  /** Reset the connection without answering. */
  | { kind: 'reset' }
  /** Answer with an unusable body (HTML, non-JSON, huge, nonsense values); status default 200. */
  | { kind: 'garbage'; body: string; contentType: string; status?: number };

/**
 * A way for the orders endpoints to fail. `timeout-after-create` is applied after validation
 * (only an order that would have been created is); the others before anything is checked.
 */
export type OrdersFailure =
  | {
      kind: 'status';
      status: number;
      body?: string;
      /** Default `application/json` with a body; `null` sends the body without a type. */
      contentType?: string | null;
      /** Further response headers (e.g. `set-cookie`), to see what the broker relays. */
      headers?: Record<string, string>;
    }
  /** Create the order, then never answer: the caller cannot know the outcome. */
  | { kind: 'timeout-after-create' }
  /** Never answer; nothing is created. */
  | { kind: 'timeout' }
  /** Reset the connection; nothing is created. */
  | { kind: 'reset' };

/** A token the emulator issued. Times are epoch milliseconds. */
export interface IssuedToken {
  token: string;
  issuedAt: number;
  expiresAt: number;
  clientId: string;
}

/** An order the emulator created. */
export interface CreatedOrder {
  id: string;
  /** The path it was posted to (one of {@link PROVIDER_ORDERS_PATHS}). */
  path: string;
  /** The parsed JSON body. */
  body: unknown;
  /** Every request header, names lowercased, repeated values joined with `, `. */
  headers: Record<string, string>;
  idempotencyKey?: string;
  /** Epoch milliseconds. */
  createdAt: number;
}

/** A non-order API call the emulator answered (echoed), in arrival order. */
export interface EchoedCall {
  method: string;
  path: string;
  /** The query string without `?`. */
  query: string;
  headers: Record<string, string>;
  /** The body as UTF-8 text. */
  body: string;
  /** Epoch milliseconds. */
  at: number;
}

/** What the emulator has seen since start or the last `reset()`. */
export interface ProviderStats {
  /** POSTs to the token endpoint, whatever their outcome. */
  tokenRequests: number;
  tokensIssued: number;
  /** Arrival time (epoch ms) of each token request, in order. */
  tokenRequestTimes: number[];
  issued: IssuedToken[];
  /** POSTs to an orders endpoint, whatever their outcome. */
  orderRequests: number;
  ordersCreated: number;
  orders: CreatedOrder[];
  /** Token requests refused for missing, malformed or wrong Basic credentials. */
  rejectedTokenAuth: number;
  /** Token requests answered 429 by `tokenGrantsPerMinute`. */
  rateLimitedTokenRequests: number;
  /** Token requests answered with a token already issued (`reissueTokens`). */
  tokensReissued: number;
  /** Non-order API requests, whatever their outcome. */
  apiRequests: number;
  /** Non-order API calls processed (valid token): each is "done" once. */
  calls: EchoedCall[];
}

function emptyStats(): ProviderStats {
  return {
    tokenRequests: 0,
    tokensIssued: 0,
    rateLimitedTokenRequests: 0,
    tokensReissued: 0,
    tokenRequestTimes: [],
    issued: [],
    orderRequests: 0,
    ordersCreated: 0,
    orders: [],
    rejectedTokenAuth: 0,
    apiRequests: 0,
    calls: [],
  };
}

/**
 * The financing provider's interface over real HTTP, in process: the client-credentials token
 * endpoint and the create-order endpoint, with knobs for the response shapes its documentation
 * leaves open and for faults (latency, error statuses, hangs, resets, garbage bodies).
 *
 * It deliberately does no idempotency on orders: every accepted request creates an order, so
 * a duplicate the broker lets through shows up in `stats.orders`.
 */
export class ProviderEmulator {
  private knobs: ProviderKnobs;
  private credentials: Map<string, string>;
  private readonly tokens = new Map<string, IssuedToken>();
  /** When tokens were granted in the last minute (`tokenGrantsPerMinute`). */
  private readonly grantTimes: number[] = [];
  /** Each client's newest token (`reissueTokens`). */
  private readonly newest = new Map<string, IssuedToken>();
  private readonly revoked = new Set<string>();
  private readonly oneShotTokenFailures: TokenFailure[] = [];
  private ordersToReject = 0;
  private callsToReject = 0;
  private current: ProviderStats = emptyStats();
  private http!: EmulatorHttpServer;

  private constructor(opts: ProviderEmulatorOptions) {
    this.knobs = { ...DEFAULT_PROVIDER_KNOBS, ...opts.knobs };
    this.credentials = new Map(Object.entries(opts.credentials));
  }

  /** Starts an emulator listening on `opts.port` (random when absent). */
  static async start(opts: ProviderEmulatorOptions): Promise<ProviderEmulator> {
    const emulator = new ProviderEmulator(opts);
    emulator.http = await EmulatorHttpServer.listen(opts, (req, res) => emulator.handle(req, res));
    return emulator;
  }

  /** Base URL for both the auth server and the API, e.g. `http://127.0.0.1:40123`. */
  get url(): string {
    return this.http.url;
  }

  /** The port actually bound. */
  get port(): number {
    return this.http.port;
  }

  /** Changes some knobs; the others keep their current values. */
  setKnobs(knobs: Partial<ProviderKnobs>): void {
    this.knobs = { ...this.knobs, ...knobs };
  }

  /** Replaces the accepted credentials (rotation): from now on only these are accepted. */
  setCredentials(credentials: Record<string, string>): void {
    this.credentials = new Map(Object.entries(credentials));
  }

  /** Makes one issued token unusable before its expiry, as a provider-side revocation would. */
  revokeToken(accessToken: string): void {
    this.revoked.add(accessToken);
  }

  /** Revokes every token issued so far (tokens issued later are valid). */
  revokeAll(): void {
    for (const token of this.tokens.keys()) this.revoked.add(token);
  }

  /** The next `n` token requests fail with `failure`, before `tokenFailure` is considered. */
  failNextTokenRequests(n: number, failure: TokenFailure): void {
    for (let i = 0; i < n; i++) this.oneShotTokenFailures.push(failure);
  }

  /**
   * The next `n` passthrough (non-order) calls get 401 `invalid_token` even with a valid token,
   * and are not processed.
   */
  rejectNextCalls(n: number): void {
    this.callsToReject += n;
  }

  /**
   * The next `n` order requests get 401 `invalid_token` even with a valid token, and create
   * nothing: a token the provider stopped honouring before the broker expected it to.
   */
  rejectNextOrders(n: number): void {
    this.ordersToReject += n;
  }

  /**
   * Clears stats and pending one-shot faults and puts the knobs back to
   * {@link DEFAULT_PROVIDER_KNOBS} (not to those given to `start`). Credentials, issued tokens
   * and revocations are kept: a provider does not forget the tokens it handed out.
   */
  reset(): void {
    this.current = emptyStats();
    this.knobs = { ...DEFAULT_PROVIDER_KNOBS };
    this.oneShotTokenFailures.length = 0;
    this.ordersToReject = 0;
    this.callsToReject = 0;
    this.grantTimes.length = 0;
  }

  /** A deep copy of what the emulator has seen, safe to keep while it carries on. */
  get stats(): ProviderStats {
    return structuredClone(this.current);
  }

  /** Whether `token` was issued here and is neither expired nor revoked right now. */
  isValidToken(token: string): boolean {
    const issued = this.tokens.get(token);
    return issued !== undefined && !this.revoked.has(token) && Date.now() < issued.expiresAt;
  }

  /** Whether `req` carries a bearer token this emulator issued and still honours. */
  private hasValidBearer(req: IncomingMessage): boolean {
    const bearer = /^bearer +(\S+)\s*$/i.exec(req.headers.authorization ?? '');
    return bearer !== null && this.isValidToken(bearer[1]);
  }

  /** Stops listening and destroys every connection, hung requests included. */
  async close(): Promise<void> {
    await this.http.close();
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const target = parseTarget(req);
    if (!target) {
      sendJson(res, 400, { error: 'invalid_request', error_description: 'Bad request target.' });
      return;
    }
    const isToken = target.pathname === PROVIDER_TOKEN_PATH;
    const isOrders = PROVIDER_ORDERS_PATHS.includes(target.pathname);
    // Below an orders path (`.../orders/123`) stays a 404, as the orders tests expect.
    const underOrders = PROVIDER_ORDERS_PATHS.some((p) => target.pathname.startsWith(`${p}/`));
    if (
      !isToken &&
      !isOrders &&
      !underOrders &&
      PROVIDER_API_PREFIXES.some((p) => target.pathname.startsWith(p))
    ) {
      await this.answerApi(req, res, target);
      return;
    }
    if (!isToken && !isOrders) {
      req.resume();
      sendJson(res, 404, { error: 'not_found' });
      return;
    }
    if (req.method !== 'POST') {
      req.resume();
      sendJson(res, 405, { error: 'method_not_allowed' }, { allow: 'POST' });
      return;
    }
    if (isToken) {
      this.current.tokenRequests++;
      this.current.tokenRequestTimes.push(Date.now());
    } else {
      this.current.orderRequests++;
    }
    const body = await readBody(req, MAX_BODY_BYTES);
    if (!body) return;
    if (body.tooLarge) {
      sendJson(res, 413, { error: 'request_too_large' });
      return;
    }
    if (isToken) {
      await this.http.delay(this.knobs.tokenLatencyMs);
      this.answerToken(req, res, target, body);
    } else {
      await this.http.delay(this.knobs.ordersLatencyMs);
      this.answerOrder(req, res, target.pathname, body);
    }
  }

  private answerToken(
    req: IncomingMessage,
    res: ServerResponse,
    target: URL,
    body: RequestBody,
  ): void {
    // RFC 6749 §5.1: token responses, errors included, must not be cached.
    const noStore = { 'cache-control': 'no-store', pragma: 'no-cache' };
    const failure = this.oneShotTokenFailures.shift() ?? this.knobs.tokenFailure;
    if (failure) {
      switch (failure.kind) {
        case 'status': {
          const headers: Record<string, string> = { ...noStore };
          if (failure.body) headers['content-type'] = failure.contentType ?? 'application/json';
          if (failure.retryAfter !== undefined) headers['retry-after'] = failure.retryAfter;
          if (failure.status === 401) headers['www-authenticate'] = 'Basic';
          send(res, failure.status, failure.body ?? '', headers);
          return;
        }
        case 'timeout':
          return;
        case 'reset':
          req.socket.resetAndDestroy();
          return;
        case 'garbage':
          send(res, failure.status ?? 200, failure.body, {
            ...noStore,
            'content-type': failure.contentType,
          });
          return;
      }
    }

    const auth = this.authenticateClient(req.headers.authorization);
    if ('problem' in auth) {
      this.current.rejectedTokenAuth++;
      sendJson(
        res,
        401,
        { error: 'invalid_client', error_description: auth.problem },
        { ...noStore, 'www-authenticate': 'Basic' },
      );
      return;
    }
    if (body.bytes.length > 0) {
      // Stock OAuth libraries put grant_type in a form body; the provider documents it in the
      // query string, with no body.
      sendJson(
        res,
        400,
        {
          error: 'invalid_request',
          error_description:
            'The token endpoint takes no request body; send grant_type in the query string.',
        },
        noStore,
      );
      return;
    }
    const grants = target.searchParams.getAll('grant_type');
    if (grants.length !== 1) {
      sendJson(
        res,
        400,
        {
          error: 'invalid_request',
          error_description: 'Exactly one grant_type query parameter is required.',
        },
        noStore,
      );
      return;
    }
    if (grants[0] !== 'client_credentials') {
      sendJson(
        res,
        400,
        {
          error: 'unsupported_grant_type',
          error_description: 'Only client_credentials is supported.',
        },
        noStore,
      );
      return;
    }

    const limit = this.knobs.tokenGrantsPerMinute;
    const now = Date.now();
    while (this.grantTimes.length > 0 && this.grantTimes[0] <= now - 60_000)
      this.grantTimes.shift();
    if (limit > 0 && this.grantTimes.length >= limit) {
      this.current.rateLimitedTokenRequests++;
      const retryAfter = Math.max(1, Math.ceil((this.grantTimes[0] + 60_000 - now) / 1000));
      sendJson(
        res,
        429,
        { error: 'rate_limited', error_description: 'Too many token requests.' },
        { ...noStore, 'retry-after': String(retryAfter) },
      );
      return;
    }
    this.grantTimes.push(now);
    const held = this.knobs.reissueTokens ? this.heldBy(auth.clientId, now) : undefined;
    const issued = held ?? this.issue(auth.clientId);
    if (held) {
      this.current.tokensReissued++;
      this.current.issued.push({ ...held });
    }
    const payload: Record<string, unknown> = { access_token: issued.token };
    if (this.knobs.tokenType !== null) payload.token_type = this.knobs.tokenType;
    const lifetime = held
      ? Math.floor((held.expiresAt - now) / 1000)
      : this.knobs.tokenLifetimeSeconds;
    switch (this.knobs.expiresIn) {
      case 'number':
        payload.expires_in = lifetime;
        break;
      case 'string':
        payload.expires_in = String(lifetime);
        break;
      case 'omit':
        break;
    }
    sendJson(res, 200, payload, noStore);
  }

  /**
   * RFC 6749 §2.3.1 says id and secret are form-urlencoded before Basic encoding, but the
   * provider's documentation just says `base64(client_id:client_secret)` and its plugin does not
   * encode.
   * Both spellings are accepted; they only differ for credentials with special characters.
   */
  private authenticateClient(
    header: string | undefined,
  ): { clientId: string } | { problem: string } {
    if (!header) return { problem: 'HTTP Basic client authentication is required.' };
    const match = /^basic +([A-Za-z0-9+/]+={0,2})\s*$/i.exec(header);
    if (!match) return { problem: 'The Authorization header is not HTTP Basic.' };
    const decoded = Buffer.from(match[1], 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0) return { problem: 'The Basic credentials are not client_id:client_secret.' };
    const id = decoded.slice(0, colon);
    const secret = decoded.slice(colon + 1);
    const formDecoded = [formDecode(id), formDecode(secret)] as const;
    for (const [candidateId, candidateSecret] of [[id, secret], formDecoded]) {
      if (candidateId === undefined || candidateSecret === undefined) continue;
      if (this.credentials.get(candidateId) === candidateSecret) return { clientId: candidateId };
    }
    return { problem: 'Unknown client or wrong client secret.' };
  }

  /** The client's newest token with a second or more left, revoked or not. */
  private heldBy(clientId: string, now: number): IssuedToken | undefined {
    const issued = this.newest.get(clientId);
    if (issued === undefined || issued.expiresAt - now < 1000) return undefined;
    this.revoked.delete(issued.token);
    return issued;
  }

  private issue(clientId: string): IssuedToken {
    let token: string;
    do token = randomBytes(32).toString('base64url');
    while (this.tokens.has(token));
    const issuedAt = Date.now();
    const issued: IssuedToken = {
      token,
      issuedAt,
      expiresAt: issuedAt + this.knobs.tokenLifetimeSeconds * 1000,
      clientId,
    };
    this.tokens.set(token, issued);
    this.newest.set(clientId, issued);
    this.current.tokensIssued++;
    this.current.issued.push({ ...issued });
    return issued;
  }

  /**
   * Any method under {@link PROVIDER_API_PREFIXES}: a valid bearer token, then the call is
   * processed (recorded in `stats.calls`) and echoed back as JSON (method, path, query, headers,
   * body; the bearer token redacted unless `echoAuthorization` says otherwise), with headers a
   * proxy must and must not relay. `GET .../large?bytes=N` streams N bytes of `x` instead, in
   * 64 KiB chunks, honouring back-pressure.
   */
  private async answerApi(req: IncomingMessage, res: ServerResponse, target: URL): Promise<void> {
    this.current.apiRequests++;
    const body = await readBody(req, MAX_BODY_BYTES);
    if (!body) return;
    if (body.tooLarge) {
      sendJson(res, 413, { error: 'request_too_large' });
      return;
    }
    if (this.callsToReject > 0) {
      this.callsToReject--;
      invalidToken(res);
      return;
    }
    const failure = this.knobs.apiFailure;
    if (failure && failed(req, res, failure)) return;
    if (!this.hasValidBearer(req)) {
      invalidToken(res);
      return;
    }
    const call: EchoedCall = {
      method: req.method ?? '',
      path: target.pathname,
      query: target.search.replace(/^\?/, ''),
      headers: lowercasedHeaders(req),
      body: body.bytes.toString('utf8'),
      at: Date.now(),
    };
    this.current.calls.push(call);
    if (failure?.kind === 'timeout-after-create') return;
    const relayTest = {
      'cache-control': 'private, max-age=5',
      'x-request-id': `prov-${randomBytes(6).toString('hex')}`,
      'set-cookie': 'provider-session=secret; HttpOnly',
      'x-internal-host': 'api-7.provider.internal',
    };
    if (req.method === 'GET' && target.pathname.endsWith('/large')) {
      const total = Number(target.searchParams.get('bytes') ?? '0');
      res.writeHead(200, { ...relayTest, 'content-type': 'application/octet-stream' });
      let sent = 0;
      while (sent < total) {
        const n = Math.min(LARGE_CHUNK.length, total - sent);
        sent += n;
        if (!res.write(n === LARGE_CHUNK.length ? LARGE_CHUNK : LARGE_CHUNK.subarray(0, n))) {
          await new Promise<void>((resolve) => {
            // Whichever comes first; the other listener goes too (one per wait would pile up).
            const done = () => {
              res.off('drain', done);
              res.off('close', done);
              resolve();
            };
            res.once('drain', done);
            res.once('close', done);
          });
          if (res.destroyed) return;
        }
      }
      res.end();
      return;
    }
    const status = req.method === 'POST' ? 201 : 200;
    const echo = this.knobs.echoAuthorization;
    if (echo === 'redacted') {
      const headers = { ...call.headers };
      if (headers.authorization !== undefined) headers.authorization = 'Bearer [redacted]';
      sendJson(res, status, { ...call, headers }, relayTest);
      return;
    }
    const text = JSON.stringify(call);
    const bearer = /^bearer +(\S+)/i.exec(call.headers.authorization ?? '')?.[1] ?? '';
    if (echo === 'verbatim' || bearer === '') {
      sendJson(res, status, call, relayTest);
      return;
    }
    // Two writes apart in time, so they leave as two chunks with the token cut between them.
    const cut = text.indexOf(bearer) + Math.floor(bearer.length / 2);
    res.writeHead(status, { ...relayTest, 'content-type': 'application/json' });
    res.write(text.slice(0, cut));
    await new Promise((resolve) => setTimeout(resolve, 10));
    res.end(text.slice(cut));
  }

  private answerOrder(
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
    body: RequestBody,
  ): void {
    if (this.ordersToReject > 0) {
      this.ordersToReject--;
      invalidToken(res);
      return;
    }
    const failure = this.knobs.ordersFailure;
    if (failure && failed(req, res, failure)) return;

    if (!this.hasValidBearer(req)) {
      invalidToken(res);
      return;
    }
    if (mediaType(req.headers['content-type']) !== 'application/json') {
      sendJson(res, 415, { errorCodes: ['UNSUPPORTED_MEDIA_TYPE'] });
      return;
    }
    let order: unknown;
    try {
      order = JSON.parse(body.bytes.toString('utf8'));
    } catch {
      order = undefined;
    }
    if (!isObject(order)) {
      sendJson(res, 400, { errorCodes: ['INVALID_REQUEST'] });
      return;
    }
    const businessError = checkOrder(order);
    if (businessError) {
      sendJson(res, 422, { errorCodes: [businessError] });
      return;
    }

    const id = `ord_${randomBytes(12).toString('hex')}`;
    const headers = lowercasedHeaders(req);
    this.current.ordersCreated++;
    this.current.orders.push({
      id,
      path,
      body: order,
      headers,
      ...(headers['idempotency-key'] !== undefined && {
        idempotencyKey: headers['idempotency-key'],
      }),
      createdAt: Date.now(),
    });
    if (failure?.kind === 'timeout-after-create') return;
    sendJson(res, 201, {
      orderId: id,
      redirectUrl: `https://checkout.example.test/r/${id}`,
      status: 'CREATED',
    });
  }
}

/** Chunk size of a streamed large answer. */
const LARGE_CHUNK = Buffer.alloc(64 * 1024, 'x');

/** The provider's answer to a missing, expired, revoked or refused bearer token. */
function invalidToken(res: ServerResponse): void {
  sendJson(
    res,
    401,
    { error: 'invalid_token' },
    { 'www-authenticate': 'Bearer error="invalid_token"' },
  );
}

/**
 * Applies an orders/API failure knob before the request is looked at. Returns whether the
 * request is done with (answered, left hanging or reset); `timeout-after-create` is not: the
 * request is processed, and only its answer withheld by the caller.
 */
function failed(req: IncomingMessage, res: ServerResponse, failure: OrdersFailure): boolean {
  switch (failure.kind) {
    case 'status': {
      const headers: Record<string, string> = { ...failure.headers };
      if (failure.body && failure.contentType !== null) {
        headers['content-type'] = failure.contentType ?? 'application/json';
      }
      send(res, failure.status, failure.body ?? '', headers);
      return true;
    }
    case 'timeout':
      return true;
    case 'reset':
      req.socket.resetAndDestroy();
      return true;
    case 'timeout-after-create':
      return false;
  }
}

/** The business rules that let tests see `errorCodes` passed through. */
function checkOrder(order: Record<string, unknown>): string | undefined {
  if (typeof order.price === 'number' && order.price < 100) return 'MIN_PRICE';
  const localization = order.localization;
  if (isObject(localization) && 'currency' in localization && localization.currency !== 'USD') {
    return 'INVALID_CURRENCY';
  }
  return undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function lowercasedHeaders(req: IncomingMessage): Record<string, string> {
  const headers: Record<string, string> = {};
  // Node already lowercases names; arrays only appear for headers that may repeat.
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  return headers;
}

/** application/x-www-form-urlencoded decoding; `undefined` for a malformed percent escape. */
function formDecode(value: string): string | undefined {
  try {
    return decodeURIComponent(value.replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}
