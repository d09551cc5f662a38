import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { BrokerConfig } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import { type ForwardedAnswer, Forwarding, type ForwardingAudit, readFailed } from './forwarding';
import type { ForwardingProfile } from './forwarding.exception';
import type { IdempotencyStore } from './idempotency-store';
import { bodyFingerprint, idempotencyKeyHash, type OrderHeaders } from './order-request';
import type {
  ApiFailure,
  ApiOutcome,
  ApiRequest,
  ProviderApiGateway,
} from '../provider/provider-api.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import type { TokenRecord } from '../token/token-record';
import type { TokenService } from '../token/token.service';
import type { ForwardTarget } from './forward-target';

export interface ForwardCall {
  readonly profile: ForwardingProfile;
  readonly client: ClientConfig;
  /** Its `Idempotency-Key`s are its own. */
  readonly caller: string;
  readonly method: string;
  readonly target: ForwardTarget;
  readonly headers: OrderHeaders;
  /** Further headers the provider sees besides `headers`. */
  readonly passed: Readonly<Record<string, string>>;
  readonly body?: Buffer;
}

export interface ForwardReply {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  /** Streams unless it was collected for an `Idempotency-Key` or replayed. */
  readonly body: Readable | Buffer;
  readonly replayed: boolean;
}

/**
 * Anything else stays at the broker: `Set-Cookie` (a provider session is not the caller's),
 * `WWW-Authenticate`, hop-by-hop and unknown headers. `X-Request-Id` comes back renamed: the
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

/** `POST /orders` returns the provider's status, body, type and `Retry-After`, nothing else. */
const ORDER_HEADERS = new Map([
  ['content-type', 'content-type'],
  ['retry-after', 'retry-after'],
]);

const KEYED_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
const SAFE_METHODS = new Set(['GET', 'HEAD']);

interface Use {
  readonly forwarding: Forwarding;
  /** The key's name in the store, and the fingerprint a repeat must match. */
  identity(call: ForwardCall, key: string): { keyHash: string; bodyHash: string };
  readonly response: Pick<ApiRequest, 'maxResponseBytes' | 'limitSetting' | 'whole'>;
  readonly maxStoredBytes: number;
  readonly returned: ReadonlyMap<string, string>;
}

/** No Nest import, so it is unit tested without the framework. */
export class ForwardingService {
  private readonly uses: Record<ForwardingProfile, Use>;

  constructor(
    tokens: Pick<TokenService, 'getToken' | 'replaceRejected'>,
    private readonly api: ProviderApiGateway,
    store: IdempotencyStore,
    config: Pick<BrokerConfig, 'orders' | 'token' | 'forward'>,
    metrics: Pick<MetricsService, 'providerLatency' | 'idempotentReplays' | 'upstreamTokenEchoes'>,
    logger: Logger,
  ) {
    const core = (profile: ForwardingProfile, ttlSeconds: number, maxRecordsPerCaller: number) =>
      new Forwarding(tokens, store, config, metrics, logger, profile, {
        ttlSeconds,
        maxRecordsPerCaller,
      });
    this.uses = profileUses(config, core);
  }

  async forward(call: ForwardCall, audit: ForwardingAudit): Promise<ForwardReply> {
    const use = this.uses[call.profile];
    const key = KEYED_METHODS.has(call.method) ? call.headers.idempotencyKey : undefined;
    const withKey = key !== undefined;
    const result = await use.forwarding.forward(
      {
        clientId: call.client.id,
        idempotency: withKey ? { caller: call.caller, ...use.identity(call, key) } : undefined,
        send: (token) => this.callProvider(call, use, token, withKey),
      },
      audit,
    );
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

  private async callProvider(
    call: ForwardCall,
    use: Use,
    token: TokenRecord,
    withKey: boolean,
  ): Promise<ForwardedAnswer | ApiFailure> {
    const { client, method, target } = call;
    const send = () =>
      this.api.call({
        client,
        accessToken: token.accessToken,
        method,
        target: `${target.path}${target.query}`,
        headers: { ...call.passed, ...call.headers.forward },
        body: call.body,
        ...use.response,
      });
    let outcome = await send();
    // Refused before a byte was written: a GET or HEAD may go once more (never a POST).
    if (outcome.kind === 'failed' && outcome.delivered === 'no' && SAFE_METHODS.has(method)) {
      outcome = await send();
    }
    return withKey
      ? collected(outcome, use.maxStoredBytes, use.returned)
      : passed(outcome, use.returned);
  }
}

function passed(
  outcome: ApiOutcome,
  names: ReadonlyMap<string, string>,
): ForwardedAnswer | ApiFailure {
  if (outcome.kind === 'failed') return outcome;
  return {
    kind: 'answered',
    status: outcome.status,
    headers: returned(outcome.headers, names),
    body: outcome.body,
  };
}

/** At most `limit` bytes, else outcome unknown: the provider did process it. */
async function collected(
  outcome: ApiOutcome,
  limit: number,
  names: ReadonlyMap<string, string>,
): Promise<ForwardedAnswer | ApiFailure> {
  if (outcome.kind === 'failed') return outcome;
  if (Buffer.isBuffer(outcome.body)) {
    return outcome.body.length <= limit
      ? passed(outcome, names)
      : tooLargeToStore(outcome.status, limit);
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
  const headers = returned(outcome.headers, names);
  delete headers['content-length'];
  return { kind: 'answered', status: outcome.status, headers, body: Buffer.concat(chunks, size) };
}

function tooLargeToStore(status: number, limit: number): ApiFailure {
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

function returned(
  headers: Record<string, string | string[] | undefined>,
  names: ReadonlyMap<string, string>,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const as = names.get(name.toLowerCase());
    if (as === undefined || value === undefined) continue;
    out[as] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}

/** What differs between the two profiles: idempotency identity, answer limits, headers. */
function profileUses(
  { orders, forward }: Pick<BrokerConfig, 'orders' | 'forward'>,
  core: (profile: ForwardingProfile, ttlSeconds: number, maxRecordsPerCaller: number) => Forwarding,
): Record<ForwardingProfile, Use> {
  return {
    orders: {
      forwarding: core('orders', orders.idempotencyTtlSeconds, 0),
      // The bare key's hash: records written before the passthrough existed stay valid.
      identity: (call, key) => ({
        keyHash: idempotencyKeyHash(key),
        bodyHash: bodyFingerprint(call.body ?? Buffer.alloc(0)),
      }),
      response: {
        maxResponseBytes: orders.maxResponseBytes,
        limitSetting: 'ORDERS_MAX_RESPONSE_BYTES',
        whole: true,
      },
      maxStoredBytes: orders.maxResponseBytes,
      returned: ORDER_HEADERS,
    },
    forward: {
      forwarding: core(
        'forward',
        forward.idempotencyTtlSeconds,
        forward.maxIdempotencyRecordsPerCaller,
      ),
      identity: (call, key) => ({
        keyHash: idempotencyKeyHash(`forward ${call.method} ${call.target.path}\n${key}`),
        bodyHash: createHash('sha256')
          .update(`${call.target.query}\n${call.passed['content-type'] ?? ''}\n`)
          .update(call.body ?? Buffer.alloc(0))
          .digest('hex'),
      }),
      response: {
        maxResponseBytes: forward.maxResponseBytes,
        limitSetting: 'FORWARD_MAX_RESPONSE_BYTES',
      },
      maxStoredBytes: forward.maxStoredResponseBytes,
      returned: RETURNED_HEADERS,
    },
  };
}
