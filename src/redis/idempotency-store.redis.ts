import type { Redis } from 'ioredis';
import {
  type ClaimResult,
  type IdempotencyClaim,
  type IdempotencyRecord,
  type IdempotencyStore,
  IdempotencyStoreErrorCode,
  IdempotencyStoreException,
  type StoredResponse,
} from '../orders/idempotency-store';
import { redisKeys } from './redis.constants';

/**
 * KEYS[1] record hash. ARGV: body hash, owner, lease deadline (epoch ms), TTL ms.
 * Check and create in one script: of any number of concurrent claims exactly one creates the
 * record, and every other one gets the record back in the same round trip.
 */
const CLAIM = `
local cur = redis.call('HMGET', KEYS[1], 'st', 'fp', 'lease', 'status', 'ct', 'body')
if cur[1] then return cur end
redis.call('HSET', KEYS[1], 'st', 'f', 'fp', ARGV[1], 'own', ARGV[2], 'lease', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`;

/**
 * KEYS[1] record hash. ARGV: owner, TTL ms, state ('c' or 'u'), then for 'c' status, content
 * type, body. Only the claimant settles its own claim: a holder that outlived its lease must
 * not overwrite what a later claimant recorded.
 */
const SETTLE = `
if redis.call('HGET', KEYS[1], 'own') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'lease')
if ARGV[3] == 'c' then
  redis.call('HSET', KEYS[1], 'st', 'c', 'status', ARGV[4], 'ct', ARGV[5], 'body', ARGV[6])
else
  redis.call('HSET', KEYS[1], 'st', 'u')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`;

/**
 * KEYS[1] record hash. ARGV: owner. Deletes only an in-flight claim of this owner: a settled
 * record (an answer, or an unknown outcome) must never be forgotten early.
 */
const RELEASE = `
local cur = redis.call('HMGET', KEYS[1], 'own', 'st')
if cur[1] ~= ARGV[1] or cur[2] ~= 'f' then return 0 end
redis.call('DEL', KEYS[1])
return 1
`;

type RawField = Buffer | null;

interface RedisWithIdempotencyScripts extends Redis {
  tbIdemClaimBuffer(key: string, ...args: (string | number)[]): Promise<number | RawField[]>;
  tbIdemSettle(key: string, ...args: (string | number | Buffer)[]): Promise<number>;
  tbIdemRelease(key: string, owner: string): Promise<number>;
}

/**
 * The idempotency store on Redis: one hash per client and key hash (`tb:{client}:idem:<sha256>`)
 * with the state, the body's SHA-256 in `fp`, the claimant in `own`, its lease, and once
 * settled the provider's status, content type and exact body bytes.
 *
 * It uses the shared command connection: commands time out after `redis.commandTimeoutMs` and
 * fail at once while disconnected, so an outage surfaces as
 * {@link IdempotencyStoreException} within that bound instead of queueing requests.
 */
export class RedisIdempotencyStore implements IdempotencyStore {
  readonly kind = 'redis' as const;
  private readonly redis: RedisWithIdempotencyScripts;

  constructor(redis: Redis) {
    redis.defineCommand('tbIdemClaim', { numberOfKeys: 1, lua: CLAIM });
    redis.defineCommand('tbIdemSettle', { numberOfKeys: 1, lua: SETTLE });
    redis.defineCommand('tbIdemRelease', { numberOfKeys: 1, lua: RELEASE });
    this.redis = redis as RedisWithIdempotencyScripts;
  }

  async claim(
    clientId: string,
    keyHash: string,
    claim: IdempotencyClaim,
    ttlMs: number,
  ): Promise<ClaimResult> {
    // The Buffer variant: a stored body is relayed byte for byte, never re-decoded as UTF-8.
    const reply = await this.run('claiming an idempotency key', () =>
      this.redis.tbIdemClaimBuffer(
        redisKeys.idempotency(clientId, keyHash),
        claim.bodyHash,
        claim.owner,
        claim.leaseUntil,
        Math.ceil(ttlMs),
      ),
    );
    if (reply === 1) return { claimed: true };
    if (!Array.isArray(reply)) throw corrupt('unexpected reply to the claim script');
    return { claimed: false, existing: parseRecord(reply) };
  }

  async complete(
    clientId: string,
    keyHash: string,
    owner: string,
    response: StoredResponse,
    ttlMs: number,
  ): Promise<boolean> {
    const done = await this.run('recording an order outcome', () =>
      this.redis.tbIdemSettle(
        redisKeys.idempotency(clientId, keyHash),
        owner,
        Math.ceil(ttlMs),
        'c',
        response.status,
        response.contentType ?? '',
        response.body,
      ),
    );
    return done === 1;
  }

  async markUnknown(
    clientId: string,
    keyHash: string,
    owner: string,
    ttlMs: number,
  ): Promise<boolean> {
    const done = await this.run('recording an unknown order outcome', () =>
      this.redis.tbIdemSettle(
        redisKeys.idempotency(clientId, keyHash),
        owner,
        Math.ceil(ttlMs),
        'u',
      ),
    );
    return done === 1;
  }

  async release(clientId: string, keyHash: string, owner: string): Promise<boolean> {
    const done = await this.run('releasing an idempotency key', () =>
      this.redis.tbIdemRelease(redisKeys.idempotency(clientId, keyHash), owner),
    );
    return done === 1;
  }

  async close(): Promise<void> {
    // The connection is shared and closed by the Redis module.
  }

  /** Runs one command, translating ioredis failures (timeout, disconnected) into ours. */
  private async run<T>(what: string, command: () => Promise<T>): Promise<T> {
    try {
      return await command();
    } catch (cause) {
      throw new IdempotencyStoreException(
        IdempotencyStoreErrorCode.Unavailable,
        `Redis failed while ${what} (${cause instanceof Error ? cause.message : String(cause)}); check REDIS_URL and the Redis server`,
        { cause },
      );
    }
  }
}

/** Reads the claim script's HMGET reply: st, fp, lease, status, ct, body. */
function parseRecord(fields: RawField[]): IdempotencyRecord {
  const [st, fp, lease, status, ct, body] = fields;
  const text = (b: RawField) => (b === null ? undefined : b.toString('utf8'));
  const bodyHash = text(fp);
  if (bodyHash === undefined) throw corrupt('record without a body hash');
  const state = text(st) ?? '';
  switch (state) {
    case 'f': {
      const leaseUntil = Number(text(lease));
      if (!Number.isFinite(leaseUntil)) throw corrupt('in-flight record without a lease');
      return { state: 'in_flight', bodyHash, leaseUntil };
    }
    case 'c': {
      const code = Number(text(status));
      if (!Number.isInteger(code) || code < 100 || code > 599) {
        throw corrupt('completed record without a valid status');
      }
      const contentType = text(ct);
      return {
        state: 'completed',
        bodyHash,
        response: {
          status: code,
          contentType: contentType === '' ? undefined : contentType,
          body: body ?? Buffer.alloc(0),
        },
      };
    }
    case 'u':
      return { state: 'unknown', bodyHash };
    default:
      throw corrupt('record in an unknown state');
  }
}

function corrupt(what: string): IdempotencyStoreException {
  return new IdempotencyStoreException(
    IdempotencyStoreErrorCode.Corrupt,
    `the idempotency store holds an unreadable record (${what}); was it written by another version?`,
  );
}
