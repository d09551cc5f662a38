import { ExecutionError, Redlock, ResourceLockedError } from '@sesamecare-oss/redlock';
import type { Redis } from 'ioredis';
import type { RedisSettings } from '../config/config.schema';
// The parser caps every lifetime at this; a stored token claiming more was not written by us.
import { MAX_LIFETIME_SECONDS } from '../provider/token-response.parser';
import type { TokenCipher } from '../token/token-cipher';
import type { TokenRecord } from '../token/token-record';
import type { RefreshLock, StoredToken, TokenStore, TokenStoreEvent } from '../token/token-store';
import { TokenStoreErrorCode, TokenStoreException } from '../token/token-store.exception';
import { redisKeys } from './redis.constants';

/**
 * KEYS[1] token hash. ARGV: expiresAt, obtainedAt, fingerprint, sealed value, channel,
 * longest believable lifetime (ms).
 *
 * The lock makes one refresher per fleet likely, not certain (a failover can grant it twice).
 * This fence is what is certain: an older token never replaces a newer one. After an
 * invalidation the stored expiry stays as a fence, and any token *requested after* the
 * invalidation may replace it even if the provider shortened lifetimes meanwhile.
 */
const WRITE_FENCED = `
-- A foreign value of another type would make every write fail (WRONGTYPE) for good.
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then redis.call('DEL', KEYS[1]) end
local cur = redis.call('HMGET', KEYS[1], 'exp', 'inv')
local curExp = tonumber(cur[1])
local inv = tonumber(cur[2])
local exp = tonumber(ARGV[1])
local obt = tonumber(ARGV[2])
-- No token we wrote expires this far beyond a request made now: corrupt, not a fence.
if curExp and curExp > obt + tonumber(ARGV[6]) then curExp = nil end
if curExp then
  if exp <= curExp and not (inv and obt > inv) then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'exp', ARGV[1], 'obt', ARGV[2], 'fp', ARGV[3], 'val', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], exp)
redis.call('PUBLISH', ARGV[5], 'u:' .. ARGV[1])
return 1
`;

/**
 * KEYS[1] token hash. ARGV: fingerprint, now, channel.
 * Only invalidate if the stored token is still the one the caller saw rejected: a storm of
 * 401s for an old token must cost one refresh, and must never discard the new token.
 */
const INVALIDATE = `
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[1], 'inv') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'inv', ARGV[2])
redis.call('HDEL', KEYS[1], 'val')
redis.call('PUBLISH', ARGV[3], 'i:' .. ARGV[1])
return 1
`;

/**
 * KEYS[1] token hash. ARGV: the corrupt value seen ('' when there was none). Deletes it only
 * if nobody replaced it: a token written since then has another (always present) value.
 */
const DISCARD_CORRUPT = `
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' then
  redis.call('DEL', KEYS[1])
  return 1
end
local val = redis.call('HGET', KEYS[1], 'val') or ''
if val == ARGV[1] or not tonumber(redis.call('HGET', KEYS[1], 'exp')) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`;

/** The longest lifetime a token we wrote can have, in ms. */
const MAX_LIFETIME_MS = MAX_LIFETIME_SECONDS * 1000;
/** Clock skew between replicas tolerated before a stored expiry counts as corrupt. */
const FENCE_SKEW_MS = 5 * 60_000;

interface RedisWithScripts extends Redis {
  tbWriteFenced(key: string, ...args: (string | number)[]): Promise<number>;
  tbInvalidate(key: string, ...args: (string | number)[]): Promise<number>;
  tbDiscardCorrupt(key: string, value: string): Promise<number>;
}

/**
 * The shared token store on Redis: a hash per client (`exp`, `obt`, `fp` in clear for the
 * fence, `val` sealed by the {@link TokenCipher}), a redlock lease for the refresher and a
 * pub/sub channel per client to wake the other replicas.
 */
export class RedisTokenStore implements TokenStore {
  readonly kind = 'redis' as const;
  private readonly redis: RedisWithScripts;
  private readonly redlock: Redlock;
  private readonly listeners: Array<(e: TokenStoreEvent) => void> = [];
  private readonly recoveredListeners: Array<() => void> = [];
  private readonly lastCorrupt = new Map<string, string>();
  private pingTimer?: NodeJS.Timeout;
  private isHealthy = false;

  constructor(
    redis: Redis,
    private readonly subscriber: Redis,
    private readonly cipher: TokenCipher,
    settings: RedisSettings,
    private readonly lockTtlMs: number,
    clientIds: readonly string[],
  ) {
    redis.defineCommand('tbWriteFenced', { numberOfKeys: 1, lua: WRITE_FENCED });
    redis.defineCommand('tbInvalidate', { numberOfKeys: 1, lua: INVALIDATE });
    redis.defineCommand('tbDiscardCorrupt', { numberOfKeys: 1, lua: DISCARD_CORRUPT });
    this.redis = redis as RedisWithScripts;
    // One attempt, no retries: a held lock means another replica is refreshing, and waiting
    // for its pub/sub message beats polling the lock.
    this.redlock = new Redlock([redis], { retryCount: 0, automaticExtensionThreshold: 200 });
    this.redlock.on('error', () => undefined);

    const channels = new Map(clientIds.map((id) => [redisKeys.events(id), id]));
    subscriber.on('message', (channel: string, message: string) => {
      const clientId = channels.get(channel);
      if (clientId !== undefined) this.dispatch(clientId, message);
    });
    // Errors surface through `healthy` and the ping; an unhandled 'error' event would crash.
    subscriber.on('error', () => undefined);
    redis.on('error', () => undefined);
    // Every reconnection counts as a recovery, even when no command failed in between (a blip
    // shorter than the ping interval): Redis may have restarted empty, and the replicas must
    // push their token back into it.
    let connectedBefore = false;
    redis.on('ready', () => {
      if (connectedBefore) this.isHealthy = false;
      connectedBefore = true;
      void this.ping();
    });
    // A resubscribed subscriber missed what was published while it was away: re-read, as after
    // an outage, rather than wait for the next refresh to notice a newer token.
    let subscribedBefore = false;
    subscriber.on('ready', () => {
      if (subscribedBefore) for (const l of this.recoveredListeners) l();
      subscribedBefore = true;
    });
    void subscriber.subscribe(...channels.keys()).catch(() => undefined);
    this.pingTimer = setInterval(() => void this.ping(), settings.pingIntervalMs);
    this.pingTimer.unref();
  }

  get healthy(): boolean {
    return this.isHealthy;
  }

  onEvent(listener: (event: TokenStoreEvent) => void): void {
    this.listeners.push(listener);
  }

  onRecovered(listener: () => void): void {
    this.recoveredListeners.push(listener);
  }

  async read(clientId: string): Promise<StoredToken> {
    const fields = await this.run(() =>
      this.redis
        .hmget(redisKeys.token(clientId), 'exp', 'obt', 'fp', 'val', 'inv')
        .catch((err: unknown) => {
          // Redis answered: it is up, but the key holds something else than our hash.
          if (err instanceof Error && err.message.startsWith('WRONGTYPE')) return undefined;
          throw err;
        }),
    );
    if (fields === undefined) return this.corrupt(clientId, '');
    const [exp, obt, fp, val, inv] = fields;
    if (exp === null && val === null && inv === null) return { status: 'absent' };
    // Invalidated (the value is gone, the expiry stays as a fence), unless the marker is junk.
    if (inv !== null && Number.isFinite(Number(inv))) return { status: 'absent' };
    const expiresAt = Number(exp);
    const obtainedAt = Number(obt);
    if (
      !Number.isFinite(expiresAt) ||
      !Number.isFinite(obtainedAt) ||
      !fp ||
      !val ||
      inv !== null ||
      // Lifetimes we store are positive and capped: anything else was not written by a broker.
      expiresAt <= obtainedAt ||
      expiresAt - obtainedAt > MAX_LIFETIME_MS
    ) {
      return this.corrupt(clientId, val ?? '');
    }
    let accessToken: string;
    try {
      accessToken = this.cipher.open(clientId, val);
    } catch {
      return this.corrupt(clientId, val);
    }
    return { status: 'found', record: { accessToken, expiresAt, obtainedAt, fingerprint: fp } };
  }

  async writeFenced(clientId: string, record: TokenRecord): Promise<boolean> {
    const sealed = this.cipher.seal(clientId, record.accessToken);
    const written = await this.run(() =>
      this.redis.tbWriteFenced(
        redisKeys.token(clientId),
        record.expiresAt,
        record.obtainedAt,
        record.fingerprint,
        sealed,
        redisKeys.events(clientId),
        MAX_LIFETIME_MS + FENCE_SKEW_MS,
      ),
    );
    return written === 1;
  }

  async invalidate(clientId: string, fingerprint: string): Promise<boolean> {
    const done = await this.run(() =>
      this.redis.tbInvalidate(
        redisKeys.token(clientId),
        fingerprint,
        Date.now(),
        redisKeys.events(clientId),
      ),
    );
    return done === 1;
  }

  async discardCorrupt(clientId: string): Promise<void> {
    const seen = this.lastCorrupt.get(clientId) ?? '';
    await this.run(() => this.redis.tbDiscardCorrupt(redisKeys.token(clientId), seen));
    this.lastCorrupt.delete(clientId);
  }

  async tryLock(clientId: string): Promise<RefreshLock | null> {
    let lock: Awaited<ReturnType<Redlock['acquire']>>;
    try {
      lock = await this.redlock.acquire([redisKeys.lock(clientId)], this.lockTtlMs);
    } catch (cause) {
      if (await isHeldElsewhere(cause)) return null;
      throw this.unavailable(cause, 'acquiring the refresh lock');
    }
    this.markHealthy();
    // Extend while alive so a slow refresh keeps the lease; a dead holder's lease runs out
    // after lockTtlMs and another replica takes over.
    let current = lock;
    const extender = setInterval(
      () => {
        current.extend(this.lockTtlMs).then(
          (l) => (current = l),
          () => clearInterval(extender),
        );
      },
      Math.max(50, Math.floor(this.lockTtlMs / 3)),
    );
    extender.unref();
    return {
      release: async () => {
        clearInterval(extender);
        await current.release().catch(() => undefined);
      },
    };
  }

  async waitUntilReady(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      await this.ping();
      if (this.isHealthy) return true;
      await new Promise((r) => setTimeout(r, 50));
    }
    return this.isHealthy;
  }

  async close(): Promise<void> {
    clearInterval(this.pingTimer);
    await Promise.allSettled([this.subscriber.quit(), this.redis.quit()]);
  }

  private corrupt(clientId: string, val: string): StoredToken {
    this.lastCorrupt.set(clientId, val);
    return { status: 'corrupt' };
  }

  private dispatch(clientId: string, message: string): void {
    let event: TokenStoreEvent | undefined;
    if (message.startsWith('u:')) {
      const expiresAt = Number(message.slice(2));
      if (Number.isFinite(expiresAt)) event = { type: 'updated', clientId, expiresAt };
    } else if (message.startsWith('i:')) {
      event = { type: 'invalidated', clientId, fingerprint: message.slice(2) };
    }
    if (event) for (const l of this.listeners) l(event);
  }

  private async ping(): Promise<void> {
    try {
      await this.run(() => this.redis.ping());
    } catch {
      // `run` already marked the store unhealthy.
    }
  }

  private async run<T>(command: () => Promise<T>): Promise<T> {
    try {
      const result = await command();
      this.markHealthy();
      return result;
    } catch (cause) {
      throw this.unavailable(cause, 'a Redis command');
    }
  }

  private markHealthy(): void {
    if (this.isHealthy) return;
    this.isHealthy = true;
    for (const l of this.recoveredListeners) l();
  }

  private unavailable(cause: unknown, what: string): TokenStoreException {
    this.isHealthy = false;
    const reason = cause instanceof Error ? cause.message : 'unknown error';
    return new TokenStoreException(
      TokenStoreErrorCode.Unavailable,
      `Redis failed during ${what} (${reason}); serving from memory until it returns. Check REDIS_URL and the Redis server; see "commandTimeoutMs" for how long a command may take`,
      { cause },
    );
  }
}

/** True when redlock failed only because another holder has the lock. */
async function isHeldElsewhere(cause: unknown): Promise<boolean> {
  if (!(cause instanceof ExecutionError)) return false;
  const stats = await Promise.all(cause.attempts);
  const errors = stats.flatMap((s) => [...s.votesAgainst.values()]);
  return errors.length > 0 && errors.every((e) => e instanceof ResourceLockedError);
}
