import type { RedisClient } from './redis.connection';

/** Lua `redisNow()`: Redis's clock (epoch ms); a replica's skewed clock must not decide expiry. */
export const REDIS_NOW = `
local function redisNow()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`;

/**
 * Lua `generationAt(key)`: the revocation generation (absent: 0). A value of another type is
 * replaced, or every script touching it would fail (WRONGTYPE) for good.
 */
const GENERATION = `
local function generationAt(key)
  local t = redis.call('TYPE', key).ok
  if t ~= 'string' then
    if t ~= 'none' then redis.call('DEL', key) end
    return 0
  end
  return tonumber(redis.call('GET', key)) or 0
end
`;

/**
 * The fence: an older token never replaces a newer one, whoever writes it. The lock makes one
 * refresher per fleet likely, not certain (a failover can grant it twice); this is what is
 * certain. After an invalidation the stored expiry stays as a fence, and any token *requested
 * after* it may replace it, even the same token again. A token requested before a revoke never lands (the generation
 * fences it). Durations come from the writer's clock; `exp`/`obt` are stored in Redis time.
 *
 * KEYS[1] token hash, KEYS[2] generation.
 * ARGV[1] remaining lifetime (ms), ARGV[2] total lifetime (ms), ARGV[3] fingerprint, ARGV[4]
 * sealed value, ARGV[5] channel, ARGV[6] longest believable lifetime (ms), ARGV[7] the writer's
 * own expiry (epoch ms, a hint), ARGV[8] the generation the token was requested in, ARGV[9]
 * the token type (`DPoP`, or empty for a bearer token: no field, as older versions write).
 * Returns {1 written | 0 fenced | -1 older generation, the current generation}.
 */
const WRITE_FENCED = `${REDIS_NOW}${GENERATION}
-- A foreign value of another type would make every write fail (WRONGTYPE) for good.
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then redis.call('DEL', KEYS[1]) end
local gen = generationAt(KEYS[2])
local writerGen = tonumber(ARGV[8]) or 0
-- Requested before a revoke: it is one of the tokens the revoke dropped.
if writerGen < gen then return {-1, gen} end
local remaining = tonumber(ARGV[1])
-- Already expired on arrival: storing it would only serve a dead token.
if remaining <= 0 then return {0, gen} end
local now = redisNow()
local exp = now + remaining
local obt = exp - tonumber(ARGV[2])
local cur = redis.call('HMGET', KEYS[1], 'exp', 'inv', 'fp')
local curExp = tonumber(cur[1])
local inv = tonumber(cur[2])
-- The stored token (or the rejected one still fencing) never comes back: converting durations
-- costs a millisecond here and there, which must not make the same token look newer. Unless it
-- was granted again after the invalidation: some providers re-issue a token until it expires.
if cur[3] == ARGV[3] and not (inv and obt > inv) then return {0, gen} end
-- No token we wrote expires this far beyond now: corrupt, not a fence.
if curExp and curExp > now + tonumber(ARGV[6]) then curExp = nil end
if curExp then
  if exp <= curExp and not (inv and obt > inv) then return {0, gen} end
end
if writerGen > gen then
  redis.call('SET', KEYS[2], writerGen)
  gen = writerGen
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'exp', exp, 'obt', obt, 'fp', ARGV[3], 'val', ARGV[4], 'wexp', ARGV[7])
if ARGV[9] and ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'typ', ARGV[9]) end
redis.call('PEXPIRE', KEYS[1], remaining)
-- The fingerprint, not a time: another replica's clock could not compare a time anyway.
redis.call('PUBLISH', ARGV[5], 'u:' .. ARGV[3])
return {1, gen}
`;

/**
 * The operator's revoke: the token hash stays until it would have expired, so the fence still
 * knows its fingerprint; the floor is lifted (a replacement is needed now).
 *
 * KEYS[1] token hash, KEYS[2] refresh floor, KEYS[3] generation. ARGV[1] channel.
 * Returns {generation, fingerprint or '', subscribers reached}.
 */
const REVOKE = `${REDIS_NOW}${GENERATION}
local gen = generationAt(KEYS[3]) + 1
redis.call('SET', KEYS[3], gen)
local fp = ''
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
  fp = redis.call('HGET', KEYS[1], 'fp') or ''
  if redis.call('HEXISTS', KEYS[1], 'inv') == 0 then
    redis.call('HSET', KEYS[1], 'inv', redisNow())
  end
  redis.call('HDEL', KEYS[1], 'val')
end
redis.call('DEL', KEYS[2])
local reached = redis.call('PUBLISH', ARGV[1], 'r:' .. gen .. ':' .. fp)
return {gen, fp, reached}
`;

/**
 * A script rather than MULTI: the ACL docs/redis.md asks for grants scripting, not transactions.
 * KEYS[1] a revocation's acknowledgements. ARGV[1] replica id, ARGV[2] TTL (ms). Returns 1.
 */
const ACKNOWLEDGE = `
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`;

/**
 * Redis's now from the same script, so the remaining lifetime is exact in Redis time.
 * KEYS[1] token hash, KEYS[2] generation. ARGV: none.
 * Returns exp, obt, fp, val, inv, wexp, Redis's now and the generation, or {'wrongtype', gen}.
 */
const READ = `${REDIS_NOW}${GENERATION}
local gen = tostring(generationAt(KEYS[2]))
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then return {'wrongtype', gen} end
local r = redis.call('HMGET', KEYS[1], 'exp', 'obt', 'fp', 'val', 'inv', 'wexp')
r[7] = tostring(redisNow())
r[8] = gen
r[9] = redis.call('HGET', KEYS[1], 'typ')
return r
`;

/**
 * {@link READ} of many clients at once, one reply per client in the order of their keys. In a
 * Cluster the keys span slots of one node (`allow-cross-slot-keys`, Redis 7): the caller groups
 * them by the node serving them. Declared keys must still share a slot, so KEYS[1] (one of them)
 * only routes the call; ARGV: the token hash and generation of each client, in pairs.
 */
const READ_MANY = `#!lua flags=allow-cross-slot-keys
${REDIS_NOW}${GENERATION}
local now = tostring(redisNow())
local out = {}
for i = 1, #ARGV, 2 do
  local gen = tostring(generationAt(ARGV[i + 1]))
  local t = redis.call('TYPE', ARGV[i]).ok
  if t ~= 'hash' and t ~= 'none' then
    out[#out + 1] = {'wrongtype', gen}
  else
    local r = redis.call('HMGET', ARGV[i], 'exp', 'obt', 'fp', 'val', 'inv', 'wexp')
    r[7] = now
    r[8] = gen
    r[9] = redis.call('HGET', ARGV[i], 'typ')
    out[#out + 1] = r
  end
end
return out
`;

/**
 * A caller's call saw the provider reject the token with this fingerprint. Only if the stored
 * token is still that one: a storm of 401s for an old token costs one refresh and never discards
 * the new one. Unlike a corrupt value it leaves the refresh floor alone, and has a floor of its
 * own: a caller who can make the provider answer 401 must not make the fleet ask for tokens
 * faster than one per `minRejectionIntervalMs`, nor more than `perCaller` times a window.
 *
 * KEYS[1] token hash, KEYS[2] rejection floor, KEYS[3] the caller's rejection count.
 * ARGV[1] fingerprint, ARGV[2] channel, ARGV[3] rejection floor (ms), ARGV[4] rejections one
 * caller may cause per window (0: no bound), ARGV[5] the window (ms).
 * Returns 1 invalidated, 0 already invalidated or replaced, -1 the rejection floor holds, -2 the
 * caller's budget is spent.
 */
const INVALIDATE = `${REDIS_NOW}
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[1], 'inv') == 1 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local budget = tonumber(ARGV[4])
if budget > 0 then
  local used = tonumber(redis.call('GET', KEYS[3])) or 0
  if used >= budget then return -2 end
  if redis.call('INCR', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
end
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[2], '1', 'PX', ARGV[3]) end
redis.call('HSET', KEYS[1], 'inv', redisNow())
redis.call('HDEL', KEYS[1], 'val')
redis.call('PUBLISH', ARGV[2], 'i:' .. ARGV[1])
return 1
`;

/**
 * Only ever extends: one replica's short backoff must not cut short another's Retry-After.
 * KEYS[1] backoff marker. ARGV[1] delay (ms). Returns the ms left.
 */
const DEFER_REFRESH = `
local delay = tonumber(ARGV[1])
local left = redis.call('PTTL', KEYS[1])
if left >= delay then return left end
if delay <= 0 then return math.max(left, 0) end
redis.call('SET', KEYS[1], '1', 'PX', delay)
return delay
`;

/**
 * KEYS[1] refresh floor. ARGV: none. Returns {PTTL, the lifetime (ms) of the grant that started
 * it, or false}; a key of another type reads as no lifetime.
 */
const REFRESH_HOLD = `
local left = redis.call('PTTL', KEYS[1])
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return {left, false} end
return {left, redis.call('GET', KEYS[1])}
`;

/**
 * The fleet's token requests to one endpoint, whichever clients and replicas send them: at most
 * ARGV[2] at once (leases that outlive a dead holder by ARGV[4] ms), and at most ARGV[3] whose
 * time at the provider may fall within one second. A request counts toward the rate from its
 * grant until a second after it ended (its score is its lease end until then): wherever in that
 * span it reached the provider, no second there holds more than ARGV[3].
 * KEYS[1] leases in flight (sorted set: id by lease end), KEYS[2] the rate's requests (sorted set:
 * id by lease end, then by end). ARGV[1] an id for this request. Times are Redis's.
 * Returns {1, 0} granted, or {0, ms until the rate may have room (0: wait for a place)}.
 */
const ENDPOINT_SLOT = `${REDIS_NOW}
local now = redisNow()
for i = 1, 2 do
  if redis.call('TYPE', KEYS[i]).ok ~= 'zset' and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('DEL', KEYS[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 1000)
local concurrency = tonumber(ARGV[2])
local perSecond = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
if concurrency > 0 and redis.call('ZCARD', KEYS[1]) >= concurrency then return {0, 0} end
if perSecond > 0 and redis.call('ZCARD', KEYS[2]) >= perSecond then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {0, math.max(1, math.min(1000, tonumber(oldest[2]) + 1000 - now))}
end
if concurrency > 0 then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease)
end
if perSecond > 0 then
  redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], lease + 1000)
end
return {1, 0}
`;

/**
 * The request with id ARGV[1] ended: its place is free, and it counts toward the rate for one
 * more second from now. KEYS as {@link ENDPOINT_SLOT}'s. Returns 1.
 */
const ENDPOINT_RELEASE = `${REDIS_NOW}
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('TYPE', KEYS[2]).ok == 'zset' then
  redis.call('ZADD', KEYS[2], 'XX', redisNow(), ARGV[1])
end
return 1
`;

/**
 * The epoch has no TTL: it must only vanish with the data. A remembered id that is gone means the
 * data was lost; a sequence not above the last seen, that the store went back in time.
 *
 * KEYS[1] epoch hash. ARGV[1] an id for a new epoch. Returns {id, sequence, Redis's now (ms)}.
 */
const EPOCH_ADVANCE = `${REDIS_NOW}
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then redis.call('DEL', KEYS[1]) end
local id = redis.call('HGET', KEYS[1], 'id')
if not id then
  id = ARGV[1]
  redis.call('HSET', KEYS[1], 'id', id, 'seq', 0)
end
return {id, redis.call('HINCRBY', KEYS[1], 'seq', 1), redisNow()}
`;

/**
 * Only if nobody replaced the corrupt value meanwhile; lifts the floor (no usable token).
 * KEYS[1] token hash, KEYS[2] refresh floor. ARGV[1] the corrupt value seen ('' when none).
 * Returns 1 deleted, 0 replaced meanwhile.
 */
const DISCARD_CORRUPT = `
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
local val = redis.call('HGET', KEYS[1], 'val') or ''
if val == ARGV[1] or not tonumber(redis.call('HGET', KEYS[1], 'exp')) then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
`;

/**
 * Uses what the broker needs, so an ACL that forbids any of it shows as NOPERM at start-up, not
 * on the first refresh. KEYS[1] token hash, KEYS[2] a key of the same slot that never exists.
 * ARGV[1] a channel nobody subscribes to. Returns 1.
 */
const PROBE = `
redis.call('HEXISTS', KEYS[1], 'exp')
redis.call('PEXPIRE', KEYS[2], 1)
redis.call('PUBLISH', ARGV[1], '')
return 1
`;

export type RedisWithScripts = RedisClient & {
  tbProbe(token: string, never: string, channel: string): Promise<number>;
  tbWriteFenced(key: string, ...args: (string | number)[]): Promise<[number, number]>;
  tbInvalidate(key: string, ...args: (string | number)[]): Promise<number>;
  tbRead(key: string, generationKey: string): Promise<(string | null)[]>;
  tbReadMany(route: string, ...keys: string[]): Promise<(string | null)[][]>;
  tbAcknowledge(key: string, replica: string, ttlMs: number): Promise<number>;
  tbRevoke(
    key: string,
    floorKey: string,
    generationKey: string,
    channel: string,
  ): Promise<[number, string, number]>;
  tbDeferRefresh(key: string, delayMs: number): Promise<number>;
  tbRefreshHold(key: string): Promise<[number, string | false | null]>;
  tbEndpointSlot(key: string, ...args: (string | number)[]): Promise<[number, number]>;
  tbEndpointRelease(key: string, grants: string, id: string): Promise<number>;
  tbEpochAdvance(key: string, id: string): Promise<[string, number, number]>;
  tbDiscardCorrupt(key: string, floorKey: string, value: string): Promise<number>;
};

/** ioredis loads each by SHA, once. */
export function defineTokenStoreScripts(redis: RedisClient): RedisWithScripts {
  redis.defineCommand('tbProbe', { numberOfKeys: 2, lua: PROBE });
  redis.defineCommand('tbWriteFenced', { numberOfKeys: 2, lua: WRITE_FENCED });
  redis.defineCommand('tbInvalidate', { numberOfKeys: 3, lua: INVALIDATE });
  redis.defineCommand('tbRead', { numberOfKeys: 2, lua: READ });
  redis.defineCommand('tbReadMany', { numberOfKeys: 1, lua: READ_MANY });
  redis.defineCommand('tbRevoke', { numberOfKeys: 3, lua: REVOKE });
  redis.defineCommand('tbAcknowledge', { numberOfKeys: 1, lua: ACKNOWLEDGE });
  redis.defineCommand('tbDeferRefresh', { numberOfKeys: 1, lua: DEFER_REFRESH });
  redis.defineCommand('tbRefreshHold', { numberOfKeys: 1, lua: REFRESH_HOLD });
  redis.defineCommand('tbEndpointSlot', { numberOfKeys: 2, lua: ENDPOINT_SLOT });
  redis.defineCommand('tbEndpointRelease', { numberOfKeys: 2, lua: ENDPOINT_RELEASE });
  redis.defineCommand('tbEpochAdvance', { numberOfKeys: 1, lua: EPOCH_ADVANCE });
  redis.defineCommand('tbDiscardCorrupt', { numberOfKeys: 2, lua: DISCARD_CORRUPT });
  return redis as RedisWithScripts;
}
