import { createHash } from 'node:crypto';
import type { RouteOptions } from 'fastify';
import { FORWARD_METHODS } from '../config/client.schema';
import type { BrokerConfig } from '../config/config.schema';
import type { ApiRequest } from '../provider/provider-api.client';
import { FORWARD_ROUTE_PREFIX } from './forward-target';
import type { ForwardingProfile } from './forwarding.exception';
import type { ForwardCall } from './forwarding.service';
import { bodyFingerprint, idempotencyKeyHash } from './order-request';

/** What a profile takes from the configuration. */
export interface ProfileSettings {
  readonly bodyLimitBytes: number;
  readonly idempotencyTtlSeconds: number;
  /** Per caller and client at once; 0: no bound. */
  readonly maxRecordsPerCaller: number;
  /** Stored bytes per caller and client at once; 0: no bound. */
  readonly maxBytesPerCaller: number;
  /** The most of an answer kept for `Idempotency-Key` replays. */
  readonly maxStoredBytes: number;
  readonly response: Pick<ApiRequest, 'maxResponseBytes' | 'limitSetting' | 'whole'>;
}

/** Everything that differs between `POST /orders` and the provider passthrough. */
export interface Profile {
  readonly route: Pick<RouteOptions, 'method' | 'url' | 'exposeHeadRoute'>;
  readonly bodyLimitSetting: string;
  /** The settings of the stored-records bounds, as refusals name them. */
  readonly recordsSetting: string;
  readonly bytesSetting: string;
  readonly span: (method: string) => string;
  /** The audit line's message. */
  readonly msg: string;
  /** How messages name what was sent. */
  readonly noun: string;
  readonly uncertain: string;
  /** Provider answer headers returned to the caller, under the name they are returned as. */
  readonly returned: ReadonlyMap<string, string>;
  readonly settings: (config: Pick<BrokerConfig, 'orders' | 'forward'>) => ProfileSettings;
  /** The key's name in the store, and the fingerprint a repeat must match. */
  readonly identity: (call: ForwardCall, key: string) => { keyHash: string; bodyHash: string };
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

export const PROFILES: Record<ForwardingProfile, Profile> = {
  orders: {
    route: { method: 'POST', url: '/orders' },
    bodyLimitSetting: 'ORDERS_BODY_LIMIT_BYTES',
    recordsSetting: 'ORDERS_IDEMPOTENCY_MAX_RECORDS_PER_CALLER',
    bytesSetting: 'ORDERS_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
    span: () => 'POST /orders',
    msg: 'order',
    noun: 'order',
    uncertain: 'the order may or may not exist',
    returned: ORDER_HEADERS,
    settings: ({ orders }) => ({
      bodyLimitBytes: orders.bodyLimitBytes,
      idempotencyTtlSeconds: orders.idempotencyTtlSeconds,
      maxRecordsPerCaller: orders.maxIdempotencyRecordsPerCaller,
      maxBytesPerCaller: orders.maxIdempotencyBytesPerCaller,
      maxStoredBytes: orders.maxResponseBytes,
      response: {
        maxResponseBytes: orders.maxResponseBytes,
        limitSetting: 'ORDERS_MAX_RESPONSE_BYTES',
        whole: true,
      },
    }),
    // The bare key's hash: records written before the passthrough existed stay valid.
    identity: (call, key) => ({
      keyHash: idempotencyKeyHash(key),
      bodyHash: bodyFingerprint(call.body ?? Buffer.alloc(0)),
    }),
  },
  forward: {
    route: {
      method: [...FORWARD_METHODS],
      url: `${FORWARD_ROUTE_PREFIX}*`,
      exposeHeadRoute: false,
    },
    bodyLimitSetting: 'FORWARD_BODY_LIMIT_BYTES',
    recordsSetting: 'FORWARD_IDEMPOTENCY_MAX_RECORDS_PER_CALLER',
    bytesSetting: 'FORWARD_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
    span: (method) => `${method} /provider/{client}/{providerPath}`,
    msg: 'forward',
    noun: 'request',
    uncertain: 'the provider may or may not have processed the request',
    returned: RETURNED_HEADERS,
    settings: ({ forward }) => ({
      bodyLimitBytes: forward.bodyLimitBytes,
      idempotencyTtlSeconds: forward.idempotencyTtlSeconds,
      maxRecordsPerCaller: forward.maxIdempotencyRecordsPerCaller,
      maxBytesPerCaller: forward.maxIdempotencyBytesPerCaller,
      maxStoredBytes: forward.maxStoredResponseBytes,
      response: {
        maxResponseBytes: forward.maxResponseBytes,
        limitSetting: 'FORWARD_MAX_RESPONSE_BYTES',
      },
    }),
    identity: (call, key) => ({
      keyHash: idempotencyKeyHash(`forward ${call.method} ${call.target.path}\n${key}`),
      bodyHash: createHash('sha256')
        .update(`${call.target.query}\n${call.passed['content-type'] ?? ''}\n`)
        .update(call.body ?? Buffer.alloc(0))
        .digest('hex'),
    }),
  },
};
