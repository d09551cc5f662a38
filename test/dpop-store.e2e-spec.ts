import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { redisSettingsSchema } from '../src/config/redis.schema';
import { RedisDpopStore } from '../src/redis/dpop-store.redis';
import { createRedisConnection } from '../src/redis/redis.connection';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import { toRecord } from '../src/token/token-record';
import { redisKeys } from '../src/redis/redis.constants';
import { AesGcmTokenCipher } from '../src/token/aes-gcm-token.cipher';
import { PlainTokenCipher } from '../src/token/token-cipher';
import { startRedis, type TestRedis } from './support/redis/standalone';

/** The fleet's DPoP state in a real redis-server: one generated key, whoever writes first. */
describe('RedisDpopStore', () => {
  let redis: TestRedis;
  const connections: Redis[] = [];
  const connect = () => {
    const c = new Redis(redis.url, { maxRetriesPerRequest: 1 });
    connections.push(c);
    return c;
  };

  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await Promise.all(connections.map((c) => c.quit()));
    await redis?.stop();
  });

  it('gives ten replicas claiming at once one key, stored sealed, and keeps it for the next', async () => {
    const key = randomBytes(32);
    const replicas = Array.from(
      { length: 10 },
      () => new RedisDpopStore(connect(), new AesGcmTokenCipher(key)),
    );
    let generated = 0;
    const claimed = await Promise.all(
      replicas.map((r, i) => r.claimKey('bank', () => `{"replica":${i},"n":${++generated}}`)),
    );
    expect(new Set(claimed).size).toBe(1);
    const stored = await connect().get(redisKeys.dpopKey('bank'));
    expect(stored).not.toContain('replica');
    expect(await connect().pttl(redisKeys.dpopKey('bank'))).toBe(-1);
    const later = new RedisDpopStore(connect(), new AesGcmTokenCipher(key));
    await expect(later.claimKey('bank', () => 'never')).resolves.toBe(claimed[0]);
    // Another client's sealed key does not open as this one's.
    await connect().set(redisKeys.dpopKey('other'), stored!);
    await expect(later.claimKey('other', () => 'x')).rejects.toThrow(
      /does not open with the cache encryption key; .*delete tb:\{other\}:dpopkey/,
    );
  });

  it('refuses to generate a key without a cache encryption key', async () => {
    const store = new RedisDpopStore(connect(), new PlainTokenCipher());
    await expect(store.claimKey('clear', () => '{}')).rejects.toThrow(
      /CACHE_KEY_SECRET_ID or CACHE_KEY_FILE/,
    );
    expect(await connect().exists(redisKeys.dpopKey('clear'))).toBe(0);
  });

  it('shares a learnt nonce per client, server and origin, for a short while', async () => {
    const a = new RedisDpopStore(connect(), new PlainTokenCipher());
    const b = new RedisDpopStore(connect(), new PlainTokenCipher());
    await a.learnNonce('bank', 'rs', 'https://api.bank.example', 'n-1');
    await expect(b.nonce('bank', 'rs', 'https://api.bank.example')).resolves.toBe('n-1');
    await expect(b.nonce('bank', 'as', 'https://api.bank.example')).resolves.toBeUndefined();
    await expect(b.nonce('other', 'rs', 'https://api.bank.example')).resolves.toBeUndefined();
    const ttl = await connect().pttl(redisKeys.dpopNonce('bank', 'rs', 'https://api.bank.example'));
    expect(ttl).toBeGreaterThan(60_000);
    expect(ttl).toBeLessThanOrEqual(120_000);
  });

  it("keeps a DPoP token record's type through Redis, authenticated, and writes no type for a bearer one", async () => {
    const settings = redisSettingsSchema.parse({ url: redis.url, pingIntervalMs: 100 });
    const store = new RedisTokenStore(
      createRedisConnection(settings, 'command'),
      createRedisConnection(settings, 'subscriber'),
      new AesGcmTokenCipher(randomBytes(32)),
      settings,
      1000,
      ['bound', 'bearer'],
    );
    try {
      await store.health.waitUntilReady(2000);
      const now = Date.now();
      const bound = toRecord({
        accessToken: 'bound-token',
        obtainedAt: now,
        expiresAt: now + 60_000,
        tokenType: 'DPoP',
      });
      const bearer = toRecord({
        accessToken: 'bearer-token',
        obtainedAt: now,
        expiresAt: now + 60_000,
      });
      await store.records.writeFenced('bound', bound);
      await store.records.writeFenced('bearer', bearer);
      expect(await store.records.read('bound')).toEqual({ status: 'found', record: bound });
      expect(await store.records.read('bearer')).toEqual({ status: 'found', record: bearer });
      expect(await connect().hexists(redisKeys.token('bearer'), 'typ')).toBe(0);
      // The type is bound to the sealed value: dropping it (a downgrade to bearer) is refused.
      await connect().hdel(redisKeys.token('bound'), 'typ');
      expect(await store.records.read('bound')).toEqual({ status: 'corrupt' });
    } finally {
      await store.health.close();
    }
  });
});
