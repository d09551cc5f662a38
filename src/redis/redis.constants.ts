import { createHash } from 'node:crypto';

/** Injection token for the shared command connection (an ioredis `Redis`), absent without REDIS_URL. */
export const REDIS_CONNECTION = 'TOKEN_BROKER:REDIS_CONNECTION';

/**
 * Key layout. Every key of a client shares the hash tag `{<client>}` so a client's token,
 * lock and idempotency records land in one Redis Cluster slot (Lua scripts need that).
 */
export const redisKeys = {
  token: (clientId: string) => `tb:{${clientId}}:token`,
  lock: (clientId: string) => `tb:{${clientId}}:lock`,
  events: (clientId: string) => `tb:{${clientId}}:events`,
  /** The fleet's shared "no provider request before" marker: exists while it is backing off. */
  backoff: (clientId: string) => `tb:{${clientId}}:backoff`,
  /**
   * The fleet's refresh floor: exists (PX `TOKEN_MIN_REFRESH_INTERVAL_MS`) after each token the
   * provider granted; no replica asks the provider for another while it does.
   */
  floor: (clientId: string) => `tb:{${clientId}}:floor`,
  /** Never-expiring marker of the data's continuity (see `TokenStore.checkContinuity`). */
  epoch: (clientId: string) => `tb:{${clientId}}:epoch`,
  /**
   * An idempotency record as versions before per-caller records wrote it: read during a
   * rolling upgrade, never written.
   */
  idempotency: (clientId: string, keyHash: string) => `tb:{${clientId}}:idem:${keyHash}`,
  /** The records a caller holds for the client (a sorted set: record key, expiry in Redis ms). */
  idempotencyQuota: (clientId: string, caller: string) =>
    `tb:{${clientId}}:idemq:${createHash('sha256').update(caller).digest('hex')}`,
  /** A caller's idempotency record: the same key sent by two callers is two records. */
  callerIdempotency: (clientId: string, caller: string, keyHash: string) =>
    `tb:{${clientId}}:idem:${createHash('sha256').update(`${keyHash}\n${caller}`).digest('hex')}`,
  /** The client's revocation generation (never expires; absent: 0). See `TokenStore.revoke`. */
  generation: (clientId: string) => `tb:{${clientId}}:gen`,
  /** The replicas that acknowledged revocation `generation` (a set, kept 10 minutes). */
  revocationAcks: (clientId: string, generation: number) => `tb:{${clientId}}:acks:${generation}`,
  /** Which replica last took the refresh lock (shown while the lock exists). */
  lockHolder: (clientId: string) => `tb:{${clientId}}:holder`,
  /** Pub/sub channel (not a key): an operator asked every replica to reload; the message is the asker's id. */
  reloadChannel: 'tb:reload',
} as const;
