import {
  callerBytes,
  callerLimit,
  type ClaimResult,
  type IdempotencyClaim,
  type IdempotencyRef,
  type IdempotencyRoute,
  type IdempotencyRecord,
  type IdempotencyStore,
  IdempotencyStoreErrorCode,
  IdempotencyStoreException,
  type Settlement,
  storedBytes,
  type StoredResponse,
} from '../forwarding/idempotency-store';
import { redisKeys } from './redis.constants';
import type { RedisClient } from './redis.connection';
import { classifyRedisError } from './redis-problem';
import { REDIS_NOW } from './token-store.lua';
import type { TokenCipher } from '../token/token-cipher';

/**
 * KEYS[1] record hash, KEYS[2] the same key's record as versions before per-caller records wrote
 * it, KEYS[3] the caller's records of this route (sorted set: record key by expiry), KEYS[4] and
 * KEYS[5] the same for the bytes bound (sorted set by expiry; hash: record key to its bytes, `#`
 * to their sum). ARGV: body hash, owner, lease length (ms), TTL ms, MAC of the body hash, most
 * records (0: no bound), most bytes (0: no bound), bytes an in-flight claim counts.
 * Check and create in one script, so exactly one of concurrent claims creates the record and
 * each claim sees the others' counts. The lease is kept on Redis's clock (TIME):
 * replicas' clocks differ. An old record answers only an exact repeat, marked 'legacy' (9th
 * field) for its MACs; a caller at a bound gets {'full' or 'bytes', ms until its oldest record
 * expires}. The counting keys expire with the longest-lived record they count.
 */
const CLAIM = `${REDIS_NOW}
local now = redisNow()
local fields = {'st', 'fp', 'lease', 'status', 'ct', 'body', 'fpm', 'mac'}
local cur = redis.call('HMGET', KEYS[1], unpack(fields))
if not cur[1] then
  local old = redis.call('HMGET', KEYS[2], unpack(fields))
  if old[1] and old[2] == ARGV[1] then
    cur = old
    cur[9] = 'legacy'
  end
end
if cur[1] then
  local lease = tonumber(cur[3])
  if lease then cur[3] = tostring(math.max(0, lease - now)) end
  return cur
end
local ttl = tonumber(ARGV[4])
local max = tonumber(ARGV[6])
local maxBytes = tonumber(ARGV[7])
local reserve = tonumber(ARGV[8])
local function wait(set)
  local oldest = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if not oldest[2] then return '1000' end
  return tostring(math.max(1, tonumber(oldest[2]) - now))
end
local function keep(key)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
if max > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= max then return {'full', wait(KEYS[3])} end
end
if maxBytes > 0 then
  -- Expired records give their bytes back; at most 1000 a claim keeps the script short.
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1000)
  local freed = 0
  for _, member in ipairs(gone) do
    freed = freed + (tonumber(redis.call('HGET', KEYS[5], member)) or 0)
    redis.call('HDEL', KEYS[5], member)
    redis.call('ZREM', KEYS[4], member)
  end
  if freed > 0 then redis.call('HINCRBY', KEYS[5], '#', -freed) end
  -- Nothing left to count (or the sum was lost with its key): start from zero.
  if redis.call('ZCARD', KEYS[4]) == 0 then redis.call('DEL', KEYS[5]) end
  local used = tonumber(redis.call('HGET', KEYS[5], '#')) or 0
  if used + reserve > maxBytes then return {'bytes', wait(KEYS[4])} end
end
if max > 0 then
  redis.call('ZADD', KEYS[3], now + ttl, KEYS[1])
  keep(KEYS[3])
end
if maxBytes > 0 then
  redis.call('ZADD', KEYS[4], now + ttl, KEYS[1])
  redis.call('HSET', KEYS[5], KEYS[1], reserve)
  redis.call('HINCRBY', KEYS[5], '#', reserve)
  keep(KEYS[4])
  keep(KEYS[5])
end
redis.call('HSET', KEYS[1], 'st', 'f', 'fp', ARGV[1], 'own', ARGV[2], 'lease', now + tonumber(ARGV[3]), 'fpm', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`;

/**
 * KEYS[1] record hash, KEYS[2] the caller's records, KEYS[3] and KEYS[4] its bytes bound (as
 * in CLAIM). ARGV: owner, TTL ms, state ('c', 'u', or 'r' to release), the bytes the record
 * counts, then for 'c' status, content type, body and its MAC. Only the claimant settles: a
 * holder that outlived its lease must not overwrite what a later claimant recorded. A release
 * deletes only an in-flight claim: a settled record must never be forgotten early. What the
 * claim counted is replaced by what the record holds, or given back with it.
 */
const SETTLE = `${REDIS_NOW}
local cur = redis.call('HMGET', KEYS[1], 'own', 'st')
if cur[1] ~= ARGV[1] then return 0 end
local counted = tonumber(redis.call('HGET', KEYS[4], KEYS[1]))
if ARGV[3] == 'r' then
  if cur[2] ~= 'f' then return 0 end
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  if counted then
    redis.call('HDEL', KEYS[4], KEYS[1])
    redis.call('ZREM', KEYS[3], KEYS[1])
    redis.call('HINCRBY', KEYS[4], '#', -counted)
  end
  return 1
end
local now = redisNow()
local ttl = tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[2], KEYS[1]) then
  redis.call('ZADD', KEYS[2], now + ttl, KEYS[1])
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
end
if counted then
  local bytes = tonumber(ARGV[4])
  redis.call('HSET', KEYS[4], KEYS[1], bytes)
  redis.call('HINCRBY', KEYS[4], '#', bytes - counted)
  redis.call('ZADD', KEYS[3], now + ttl, KEYS[1])
  for _, key in ipairs({KEYS[3], KEYS[4]}) do
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  end
end
redis.call('HDEL', KEYS[1], 'lease')
if ARGV[3] == 'c' then
  redis.call('HSET', KEYS[1], 'st', 'c', 'status', ARGV[5], 'ct', ARGV[6], 'body', ARGV[7], 'mac', ARGV[8])
else
  redis.call('HSET', KEYS[1], 'st', 'u')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`;

/** The script's state argument, and what an error says was under way. */
const SETTLING = {
  completed: ['c', 'recording an order outcome'],
  unknown: ['u', 'recording an unknown order outcome'],
  released: ['r', 'releasing an idempotency key'],
} as const;

type RawField = Buffer | null;

type RedisWithIdempotencyScripts = RedisClient & {
  tbIdemClaimBuffer(
    key: string,
    legacyKey: string,
    ...args: (string | number)[]
  ): Promise<number | RawField[]>;
  tbIdemSettle(key: string, ...args: (string | number | Buffer)[]): Promise<number>;
};

/**
 * One hash per client, caller and key hash, each caller's records listed by expiry. With a cache
 * key, the body hash and stored answer carry an HMAC bound to client, caller and key, so whoever
 * can write Redis cannot make a broker replay an answer of their choosing, and the answer is
 * sealed like the token, so whoever can read Redis cannot read it.
 */
export class RedisIdempotencyStore implements IdempotencyStore {
  private readonly redis: RedisWithIdempotencyScripts;

  constructor(
    redis: RedisClient,
    private readonly signer: Pick<
      TokenCipher,
      'authenticates' | 'mac' | 'verifyMac' | 'sealBytes' | 'openBytes'
    >,
  ) {
    redis.defineCommand('tbIdemClaim', { numberOfKeys: 5, lua: CLAIM });
    redis.defineCommand('tbIdemSettle', { numberOfKeys: 4, lua: SETTLE });
    this.redis = redis as RedisWithIdempotencyScripts;
  }

  async claim(ref: IdempotencyRef, claim: IdempotencyClaim, ttlMs: number): Promise<ClaimResult> {
    // The Buffer variant: a stored body is relayed byte for byte, never re-decoded as UTF-8.
    const { quota } = claim;
    const reply = await this.run('claiming an idempotency key', () =>
      this.redis.tbIdemClaimBuffer(
        recordKey(ref),
        redisKeys.idempotency(ref.clientId, ref.keyHash),
        ...quotaKeys(ref, quota?.profile),
        claim.bodyHash,
        claim.owner,
        Math.ceil(claim.leaseMs),
        Math.ceil(ttlMs),
        this.signer.mac(macParts('fp', ref, false, claim.bodyHash)),
        quota?.maxRecords ?? 0,
        quota?.maxBytes ?? 0,
        quota?.reserveBytes ?? 0,
      ),
    );
    if (reply === 1) return { claimed: true };
    if (!Array.isArray(reply)) throw corrupt('unexpected reply to the claim script');
    if (reply.length === 2 && quota) {
      const bound = latin1(reply[0]);
      const wait = Number(latin1(reply[1]));
      if (bound === 'full') throw callerLimit(ref, quota, wait);
      if (bound === 'bytes') throw callerBytes(ref, quota, wait);
    }
    return { claimed: false, existing: this.verified(ref, reply) };
  }

  async settle(
    ref: IdempotencyRef,
    owner: string,
    settlement: Settlement,
    ttlMs: number,
    profile?: IdempotencyRoute,
  ): Promise<boolean> {
    const [state, what] = SETTLING[settlement.state];
    const answer =
      settlement.state === 'completed'
        ? [
            settlement.response.status,
            settlement.response.contentType ?? '',
            this.signer.sealBytes(bodyContext(ref), settlement.response.body),
            this.signer.mac(answerParts(ref, settlement.response)),
          ]
        : [];
    const done = await this.run(what, () =>
      this.redis.tbIdemSettle(
        recordKey(ref),
        ...quotaKeys(ref, profile),
        owner,
        Math.ceil(ttlMs),
        state,
        storedBytes(settlement),
        ...answer,
      ),
    );
    return done === 1;
  }

  async close(): Promise<void> {
    // The connection is shared and closed by the Redis module.
  }

  /** The stored record, opened and checked: a `legacy` one is in clear, its MACs as it was. */
  private verified(ref: IdempotencyRef, fields: RawField[]): IdempotencyRecord {
    let record = parseRecord(fields);
    const legacy = latin1(fields[8]) === 'legacy';
    if (!legacy && record.state === 'completed') {
      let body;
      try {
        body = this.signer.openBytes(bodyContext(ref), record.response.body);
      } catch {
        throw tampered('its stored answer does not open with the cache key for this record');
      }
      record = { ...record, response: { ...record.response, body } };
    }
    if (!this.signer.authenticates) return record;
    if (!this.signer.verifyMac(macParts('fp', ref, legacy, record.bodyHash), latin1(fields[6]))) {
      throw tampered('its body hash is not one a broker recorded for this key');
    }
    if (
      record.state === 'completed' &&
      !this.signer.verifyMac(answerParts(ref, record.response, legacy), latin1(fields[7]))
    ) {
      throw tampered('its stored answer is not one a broker recorded for this key');
    }
    return record;
  }

  private async run<T>(what: string, command: () => Promise<T>): Promise<T> {
    try {
      return await command();
    } catch (cause) {
      // An ACL or credentials problem is named as such: "check the server" would mislead.
      const problem = classifyRedisError(cause);
      throw new IdempotencyStoreException(
        IdempotencyStoreErrorCode.Unavailable,
        problem
          ? `Redis failed while ${what}: ${problem.message}`
          : `Redis failed while ${what} (${cause instanceof Error ? cause.message : String(cause)}); check the Redis settings (REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES) and the Redis server`,
        { cause },
      );
    }
  }
}

/** st, fp, lease (ms left), status, ct, body. */
function parseRecord(fields: RawField[]): IdempotencyRecord {
  const [st, fp, lease, status, ct, body] = fields;
  const text = (b: RawField) => (b === null ? undefined : b.toString('utf8'));
  const bodyHash = text(fp);
  if (bodyHash === undefined) throw corrupt('record without a body hash');
  const state = text(st) ?? '';
  switch (state) {
    case 'f': {
      const leaseRemainingMs = Number(text(lease));
      if (!Number.isFinite(leaseRemainingMs)) throw corrupt('in-flight record without a lease');
      return { state: 'in_flight', bodyHash, leaseRemainingMs };
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

/**
 * What a MAC covers: the client, caller and key, then `rest`. A `legacy` record, written before
 * records were per caller (read, never written), covers no caller and names its kind unnumbered.
 */
function macParts(
  kind: 'fp' | 'answer',
  ref: IdempotencyRef,
  legacy: boolean,
  ...rest: (string | Buffer)[]
): (string | Buffer)[] {
  const { clientId, caller, keyHash } = ref;
  return legacy
    ? [kind, clientId, keyHash, ...rest]
    : [`${kind}2`, clientId, caller, keyHash, ...rest];
}

/** The answer's every replayed byte. */
function answerParts(ref: IdempotencyRef, r: StoredResponse, legacy = false): (string | Buffer)[] {
  return macParts('answer', ref, legacy, String(r.status), r.contentType ?? '', r.body);
}

/** A reply field as the script stored it ('' when absent). */
function latin1(field: RawField | undefined): string {
  return field?.toString('latin1') ?? '';
}

function bodyContext(ref: IdempotencyRef): string[] {
  return ['idempotency answer', ref.clientId, ref.caller, ref.keyHash];
}

function recordKey(ref: IdempotencyRef): string {
  return redisKeys.callerIdempotency(ref.clientId, ref.caller, ref.keyHash);
}

/**
 * The count, then the bytes bound's two keys, of a route's records. Without a route, the
 * passthrough's: the scripts only touch a key that counts this very record.
 */
function quotaKeys(
  ref: IdempotencyRef,
  profile: IdempotencyRoute = 'forward',
): [string, string, string] {
  const { clientId, caller } = ref;
  return [
    profile === 'orders'
      ? redisKeys.ordersIdempotencyQuota(clientId, caller)
      : redisKeys.idempotencyQuota(clientId, caller),
    redisKeys.idempotencyBytesExpiry(clientId, profile, caller),
    redisKeys.idempotencyBytes(clientId, profile, caller),
  ];
}

function tampered(why: string): IdempotencyStoreException {
  return new IdempotencyStoreException(
    IdempotencyStoreErrorCode.Tampered,
    `the idempotency record fails its integrity check: ${why}`,
  );
}

function corrupt(what: string): IdempotencyStoreException {
  return new IdempotencyStoreException(
    IdempotencyStoreErrorCode.Corrupt,
    `the idempotency store holds an unreadable record (${what}); was it written by another version?`,
  );
}
