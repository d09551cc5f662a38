import { createHash } from 'node:crypto';

function endpointTag(endpoint: string): string {
  return createHash('sha256').update(endpoint).digest('hex').slice(0, 32);
}

/** Every key of a client shares the hash tag `{<client>}`: Lua scripts need one Cluster slot. */
export const redisKeys = {
  token: (clientId: string) => `tb:{${clientId}}:token`,
  lock: (clientId: string) => `tb:{${clientId}}:lock`,
  events: (clientId: string) => `tb:{${clientId}}:events`,
  /** Exists while the fleet backs off. */
  backoff: (clientId: string) => `tb:{${clientId}}:backoff`,
  /** Exists after each grant (PX `TOKEN_MIN_REFRESH_INTERVAL_MS`): no replica asks meanwhile. */
  floor: (clientId: string) => `tb:{${clientId}}:floor`,
  /** Exists after a rejection invalidated the token (PX `TOKEN_MIN_REJECTION_INTERVAL_MS`). */
  rejectionFloor: (clientId: string) => `tb:{${clientId}}:rejfloor`,
  /** How many invalidations one caller's calls caused in the current window. */
  callerRejections: (clientId: string, caller: string) =>
    `tb:{${clientId}}:rej:${createHash('sha256').update(caller).digest('hex').slice(0, 32)}`,
  /**
   * One token endpoint's requests in flight and of the last second, fleet-wide: a hash tag of
   * their own, since every client of an authorization server shares them.
   */
  endpointInFlight: (endpoint: string) => `tb:{ep:${endpointTag(endpoint)}}:inflight`,
  endpointGrants: (endpoint: string) => `tb:{ep:${endpointTag(endpoint)}}:grants`,
  /** Never expires: it must only vanish with the data. */
  epoch: (clientId: string) => `tb:{${clientId}}:epoch`,
  /** Written by older versions: read during a rolling upgrade, never written. */
  idempotency: (clientId: string, keyHash: string) => `tb:{${clientId}}:idem:${keyHash}`,
  /** Sorted set: record key by expiry in Redis ms. */
  idempotencyQuota: (clientId: string, caller: string) =>
    `tb:{${clientId}}:idemq:${createHash('sha256').update(caller).digest('hex')}`,
  /** `POST /orders`' count of the same: the passthrough's predates it and keeps its name. */
  ordersIdempotencyQuota: (clientId: string, caller: string) =>
    `tb:{${clientId}}:idemo:${createHash('sha256').update(caller).digest('hex')}`,
  /** Sorted set per route: record key by expiry in Redis ms, for the bytes bound. */
  idempotencyBytesExpiry: (clientId: string, route: string, caller: string) =>
    `tb:{${clientId}}:idemb:${route}:${createHash('sha256').update(caller).digest('hex')}`,
  /** Hash per route: record key to the bytes it counts, and `#` to their sum. */
  idempotencyBytes: (clientId: string, route: string, caller: string) =>
    `tb:{${clientId}}:idems:${route}:${createHash('sha256').update(caller).digest('hex')}`,
  /** The same key sent by two callers is two records. */
  callerIdempotency: (clientId: string, caller: string, keyHash: string) =>
    `tb:{${clientId}}:idem:${createHash('sha256').update(`${keyHash}\n${caller}`).digest('hex')}`,
  /** Never expires; absent: 0. */
  generation: (clientId: string) => `tb:{${clientId}}:gen`,
  /** A set, kept 10 minutes. */
  revocationAcks: (clientId: string, generation: number) => `tb:{${clientId}}:acks:${generation}`,
  lockHolder: (clientId: string) => `tb:{${clientId}}:holder`,
  /** The generated DPoP proof key, sealed; never expires (a restart keeps the key). */
  dpopKey: (clientId: string) => `tb:{${clientId}}:dpopkey`,
  /** A server's last `DPoP-Nonce` for the client (PX a short while), `as` or `rs` per origin. */
  dpopNonce: (clientId: string, server: string, origin: string) =>
    `tb:{${clientId}}:dpopnonce:${server}:${createHash('sha256').update(origin).digest('hex').slice(0, 32)}`,
  /** Pub/sub channel (not a key); the message is the asker's id. */
  reloadChannel: 'tb:reload',
} as const;
