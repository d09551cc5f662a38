import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { BrokerConfig } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import { type Exchange, Forwarding, type ForwardingAudit } from './forwarding';
import type { IdempotencyStore } from './idempotency-store';
import { idempotencyKeyHash, type OrderHeaders } from './order-request';
import type { ApiOutcome, ProviderApiGateway } from '../provider/provider-api.client';
import type { CheckoutFailure } from '../provider/checkout.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { translateTransportError } from '../provider/provider-http';
import { echoesToken, screenStream } from './token-echo.screen';
import type { TokenRecord } from '../token/token-record';
import type { TokenService } from '../token/token.service';
import type { ForwardTarget } from './forward-target';

/** A checked passthrough request, ready to forward. */
export interface ForwardCall {
  readonly client: ClientConfig;
  /** The caller's name: its `Idempotency-Key`s are its own. */
  readonly caller: string;
  readonly method: string;
  readonly target: ForwardTarget;
  /** Idempotency key, request id and trace context, as for orders. */
  readonly headers: OrderHeaders;
  /** Further caller headers the provider may see (content type, accept, accept-language). */
  readonly passed: Readonly<Record<string, string>>;
  /** The request body (bounded by `forward.bodyLimitBytes`), or none. */
  readonly body?: Buffer;
}

/** The provider's answer as the route relays it. */
export interface ForwardReply {
  readonly status: number;
  /** The provider's headers that are safe to return (see {@link RETURNED_HEADERS}). */
  readonly headers: Readonly<Record<string, string>>;
  /** Streams unless it was collected for an `Idempotency-Key` or replayed. */
  readonly body: Readable | Buffer;
  readonly replayed: boolean;
}

/** What the passthrough's answer carries to the core: headers filtered, body streamed or whole. */
interface PassAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: Readable | Buffer;
}

/**
 * Provider headers returned to the caller. Anything else stays at the broker: `Set-Cookie`
 * (a provider session is not the caller's), `WWW-Authenticate`, hop-by-hop headers, and any
 * header this list does not know. The provider's `X-Request-Id` comes back renamed, since the
 * broker's own request id owns the name.
 */
const RETURNED_HEADERS = new Map<string, string>([
  ['content-type', 'content-type'],
  ['content-length', 'content-length'],
  ['content-language', 'content-language'],
  ['content-disposition', 'content-disposition'],
  ['cache-control', 'cache-control'],
  ['expires', 'expires'],
  ['etag', 'etag'],
  ['last-modified', 'last-modified'],
  ['vary', 'vary'],
  ['retry-after', 'retry-after'],
  ['location', 'location'],
  ['x-request-id', 'x-provider-request-id'],
  ['request-id', 'x-provider-request-id'],
  ['x-correlation-id', 'x-provider-correlation-id'],
  ['idempotent-replayed', 'x-provider-idempotent-replayed'],
  ['idempotency-replayed', 'x-provider-idempotent-replayed'],
]);

/** Methods whose `Idempotency-Key` the broker honours (claim, replay, 409, 422). */
const KEYED_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
/** Methods retried once when the connection was refused before anything was sent. */
const SAFE_METHODS = new Set(['GET', 'HEAD']);

/**
 * `/provider/<client>/...`: any allowed provider call, as a use of the {@link Forwarding} core
 * that `POST /orders` uses (401 → fenced invalidate + one retry, nothing that may have arrived
 * sent again, idempotency). Its own: the target is the caller's path and query, answers stream
 * back (collected, bounded, only when an `Idempotency-Key` needs them stored), GET and HEAD are
 * retried once when the connection was refused before sending, and keys are scoped by method
 * and path (the query and body make up the fingerprint).
 */
export class ForwardService {
  private readonly forwarding: Forwarding;

  constructor(
    tokens: Pick<TokenService, 'getToken' | 'replaceRejected'>,
    private readonly api: ProviderApiGateway,
    store: IdempotencyStore,
    private readonly config: Pick<BrokerConfig, 'orders' | 'token' | 'forward'>,
    metrics: Pick<MetricsService, 'providerLatency' | 'idempotentReplays' | 'upstreamTokenEchoes'>,
    logger: Logger,
  ) {
    this.forwarding = new Forwarding(tokens, store, config, metrics, logger, 'forward', {
      ttlSeconds: config.forward.idempotencyTtlSeconds,
      maxRecordsPerCaller: config.forward.maxIdempotencyRecordsPerCaller,
    });
  }

  /** Forwards `call` (or replays what its key recorded); throws passthrough or token problems. */
  async forward(call: ForwardCall, audit: ForwardingAudit): Promise<ForwardReply> {
    const { client, method, target } = call;
    const key = KEYED_METHODS.has(method) ? call.headers.idempotencyKey : undefined;
    const withKey = key !== undefined;
    const exchange: Exchange<PassAnswer> = {
      clientId: client.id,
      idempotency: withKey
        ? {
            caller: call.caller,
            keyHash: idempotencyKeyHash(`forward ${method} ${target.path}\n${key}`),
            bodyHash: createHash('sha256')
              .update(`${target.query}\n${call.passed['content-type'] ?? ''}\n`)
              .update(call.body ?? Buffer.alloc(0))
              .digest('hex'),
          }
        : undefined,
      send: (token) => this.callProvider(call, token, withKey),
      discard: (answer) => {
        if (!Buffer.isBuffer(answer.body)) answer.body.resume();
      },
      screen: (answer, tokens, onLateEcho) => screened(answer, tokens, onLateEcho),
      stored: (answer) => ({
        status: answer.status,
        contentType: answer.headers['content-type'],
        body: answer.body as Buffer,
      }),
    };
    const result = await this.forwarding.forward(exchange, audit);
    if (result.kind === 'replayed') {
      const { status, contentType, body } = result.response;
      return {
        status,
        headers: contentType === undefined ? {} : { 'content-type': contentType },
        body,
        replayed: true,
      };
    }
    return { ...result.answer, replayed: false };
  }

  /** Sends `call` with `token`, and once more if a GET or HEAD was refused before sending. */
  private async callProvider(
    call: ForwardCall,
    token: TokenRecord,
    withKey: boolean,
  ): Promise<PassAnswer | CheckoutFailure> {
    const { client, method, target } = call;
    const limits = this.config.forward;
    const send = () =>
      this.api.call({
        client,
        accessToken: token.accessToken,
        method,
        target: `${target.path}${target.query}`,
        headers: { ...call.passed, ...call.headers.forward },
        body: call.body,
        maxResponseBytes: limits.maxResponseBytes,
      });
    let outcome = await send();
    // Refused before a byte was written: a GET or HEAD may go once more (never a POST).
    if (outcome.kind === 'failed' && outcome.delivered === 'no' && SAFE_METHODS.has(method)) {
      outcome = await send();
    }
    return withKey ? collected(outcome, limits.maxStoredResponseBytes) : passed(outcome);
  }
}

/** How much of a streamed answer is read before its status is relayed, to screen it whole. */
const SCREEN_BEFORE_RELAY_BYTES = 64 * 1024;

/** The answer unless it echoes a token (see {@link Exchange.screen}). */
async function screened(
  answer: PassAnswer,
  tokens: readonly string[],
  onLateEcho: () => void,
): Promise<PassAnswer | CheckoutFailure | 'echoed'> {
  // The returned headers too: a debugging redirect may carry it in `Location`.
  if (echoesToken(Buffer.from(Object.values(answer.headers).join('\n')), tokens)) {
    if (!Buffer.isBuffer(answer.body)) answer.body.destroy();
    return 'echoed';
  }
  if (Buffer.isBuffer(answer.body)) return echoesToken(answer.body, tokens) ? 'echoed' : answer;
  let result;
  try {
    result = await screenStream(answer.body, tokens, SCREEN_BEFORE_RELAY_BYTES, onLateEcho);
  } catch (cause) {
    return readFailed(cause);
  }
  return 'echoed' in result ? 'echoed' : { ...answer, body: result.body };
}

/** The answer with its returned headers, body still streaming. */
function passed(outcome: ApiOutcome): PassAnswer | CheckoutFailure {
  if (outcome.kind === 'failed') return outcome;
  return {
    kind: 'answered',
    status: outcome.status,
    headers: returned(outcome.headers),
    body: outcome.body,
  };
}

/**
 * The answer collected whole, for the idempotency record: at most `limit` bytes, else a
 * failure whose outcome is unknown (the provider did process it).
 */
async function collected(
  outcome: ApiOutcome,
  limit: number,
): Promise<PassAnswer | CheckoutFailure> {
  if (outcome.kind === 'failed') return outcome;
  if (Buffer.isBuffer(outcome.body)) {
    if (outcome.body.length <= limit) {
      return {
        kind: 'answered',
        status: outcome.status,
        headers: returned(outcome.headers),
        body: outcome.body,
      };
    }
    return tooLargeToStore(outcome.status, limit);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of outcome.body) {
      size += (chunk as Buffer).length;
      if (size > limit) {
        outcome.body.destroy();
        return tooLargeToStore(outcome.status, limit);
      }
      chunks.push(chunk as Buffer);
    }
  } catch (cause) {
    return readFailed(cause);
  }
  const headers = returned(outcome.headers);
  delete headers['content-length'];
  return { kind: 'answered', status: outcome.status, headers, body: Buffer.concat(chunks, size) };
}

/** An answer too large to keep for replays: sent and processed, so its outcome is unknown. */
function tooLargeToStore(status: number, limit: number): CheckoutFailure {
  return {
    kind: 'failed',
    delivered: 'maybe',
    error: new ProviderException(
      ProviderErrorCode.MalformedResponse,
      `the provider answered HTTP ${status} with a body over ${limit} bytes, too large to keep for Idempotency-Key replays (FORWARD_MAX_STORED_RESPONSE_BYTES)`,
      { status },
    ),
  };
}

function returned(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const as = RETURNED_HEADERS.get(name.toLowerCase());
    if (as === undefined || value === undefined) continue;
    out[as] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}

/** An answer whose body failed while being read: it may have been acted on, so never resent. */
function readFailed(cause: unknown) {
  return {
    kind: 'failed',
    delivered: 'maybe',
    error:
      cause instanceof ProviderException
        ? cause
        : translateTransportError(cause, 'reading the provider answer'),
  } as const;
}
