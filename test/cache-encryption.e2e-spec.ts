import { createHash, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { redisSettingsSchema } from '../src/config/redis.schema';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { redisKeys } from '../src/redis/redis.constants';
import { createRedisConnection } from '../src/redis/redis.connection';
import { RedisTokenStore } from '../src/redis/token-store.redis';
import { AesGcmTokenCipher } from '../src/token/aes-gcm-token.cipher';
import { toRecord } from '../src/token/token-record';
import { startRedis, type TestRedis } from './support/redis/standalone';
import { type Stack, type StackBroker, startStack } from './support/stack';
import { waitFor } from './support/wait';

const CLIENTS = ['acme-prod', 'globex-prod'] as const;

/** Every field of a client's token hash, as anyone with Redis access would read it. */
async function rawHash(raw: Redis, clientId: string): Promise<Record<string, string>> {
  return raw.hgetall(redisKeys.token(clientId));
}

/**
 * The token at rest: AES-256-GCM in Redis with the client id bound, against real Redis, both
 * through the store directly and through brokers.
 */
// Jest applies `testTimeout` only at the top level of its config, not per project, and
// starting brokers can take seconds on a busy machine.
jest.setTimeout(60_000);

describe('cache encryption at rest (real Redis)', () => {
  let redis: TestRedis;
  let raw: Redis;
  const k1 = randomBytes(32);
  const k2 = randomBytes(32);

  beforeAll(async () => {
    redis = await startRedis();
    raw = new Redis(redis.url, { maxRetriesPerRequest: 1 });
  });

  afterAll(async () => {
    raw?.disconnect();
    await redis?.stop();
  });

  describe(RedisTokenStore.name, () => {
    const stores: RedisTokenStore[] = [];

    function newStore(cipher: AesGcmTokenCipher): RedisTokenStore {
      const settings = redisSettingsSchema.parse({ url: redis.url, pingIntervalMs: 100 });
      const store = new RedisTokenStore(
        createRedisConnection(settings, 'command'),
        createRedisConnection(settings, 'subscriber'),
        cipher,
        settings,
        1000,
        [...CLIENTS],
      );
      stores.push(store);
      return store;
    }

    const token = (name: string) => `${name}-${randomBytes(24).toString('base64url')}`;
    const record = (accessToken: string) =>
      toRecord({ accessToken, obtainedAt: Date.now(), expiresAt: Date.now() + 60_000 });

    afterEach(async () => {
      await Promise.all(stores.splice(0).map((s) => s.health.close()));
      await redis.flush();
    });

    it('stores no token in clear: only expiry, fingerprint and the sealed value', async () => {
      const store = newStore(new AesGcmTokenCipher(k1));
      await store.health.waitUntilReady(2000);
      const r = record(token('acme'));
      await store.records.writeFenced('acme-prod', r);
      const hash = await rawHash(raw, 'acme-prod');
      expect(Object.keys(hash).sort()).toEqual(['exp', 'fp', 'obt', 'val', 'wexp']);
      expect(hash.val).toMatch(/^gcm3:[0-9a-f]{8}:/);
      for (const value of Object.values(hash)) {
        expect(value).not.toContain(r.accessToken);
        expect(value).not.toContain(r.accessToken.slice(5, 25));
      }
      expect(await store.records.read('acme-prod')).toEqual({ status: 'found', record: r });
    });

    it('rejects a value swapped in from another client (whole hash or value only), then lets a fresh one in', async () => {
      const store = newStore(new AesGcmTokenCipher(k1));
      await store.health.waitUntilReady(2000);
      await store.records.writeFenced('acme-prod', record(token('acme')));
      const globex = record(token('globex'));
      await store.records.writeFenced('globex-prod', globex);
      const stolen = await rawHash(raw, 'globex-prod');

      await raw.hset(redisKeys.token('acme-prod'), 'val', stolen.val);
      expect(await store.records.read('acme-prod')).toEqual({ status: 'corrupt' });

      await raw.del(redisKeys.token('acme-prod'));
      await raw.hset(redisKeys.token('acme-prod'), stolen);
      expect(await store.records.read('acme-prod')).toEqual({ status: 'corrupt' });

      await store.records.discardCorrupt('acme-prod');
      expect(await store.records.read('acme-prod')).toEqual({ status: 'absent' });
      const fresh = record(token('acme'));
      expect(await store.records.writeFenced('acme-prod', fresh)).toBe(true);
      expect(await store.records.read('acme-prod')).toEqual({ status: 'found', record: fresh });
      // The victim of the swap was never touched.
      expect(await store.records.read('globex-prod')).toEqual({ status: 'found', record: globex });
    });

    it('treats a value it has no key for, or a tampered one, as corrupt (never a crash)', async () => {
      const writer = newStore(new AesGcmTokenCipher(k1));
      const reader = newStore(new AesGcmTokenCipher(k2));
      await Promise.all([writer.health.waitUntilReady(2000), reader.health.waitUntilReady(2000)]);
      await writer.records.writeFenced('acme-prod', record(token('acme')));
      expect(await reader.records.read('acme-prod')).toEqual({ status: 'corrupt' });

      const { val } = await rawHash(raw, 'acme-prod');
      const flipped = `${val.slice(0, -3)}${val.at(-3) === 'A' ? 'B' : 'A'}${val.slice(-2)}`;
      await raw.hset(redisKeys.token('acme-prod'), 'val', flipped);
      expect(await writer.records.read('acme-prod')).toEqual({ status: 'corrupt' });
      for (const garbage of [
        '',
        'gcm1:',
        'gcm1:zz:!!',
        'gcm2:',
        'gcm2:zz:!!',
        'plain:tok',
        '\u0000'.repeat(40),
      ]) {
        await raw.hset(redisKeys.token('acme-prod'), 'val', garbage);
        expect(await writer.records.read('acme-prod')).toEqual({ status: 'corrupt' });
      }
    });

    it('reads values written before a key rotation and writes with the new key', async () => {
      const before = newStore(new AesGcmTokenCipher(k1));
      const after = newStore(new AesGcmTokenCipher(k2, [k1]));
      await Promise.all([before.health.waitUntilReady(2000), after.health.waitUntilReady(2000)]);
      const old = record(token('acme'));
      await before.records.writeFenced('acme-prod', old);
      expect(await after.records.read('acme-prod')).toEqual({ status: 'found', record: old });
      const renewed = toRecord({
        accessToken: token('acme'),
        obtainedAt: Date.now(),
        expiresAt: Date.now() + 120_000,
      });
      await after.records.writeFenced('acme-prod', renewed);
      const { val } = await rawHash(raw, 'acme-prod');
      expect(val.startsWith(`gcm3:${new AesGcmTokenCipher(k2).currentKeyId}:`)).toBe(true);
    });

    it('refuses a record whose clear fields were edited: pinned expiry, lifetime, fingerprint', async () => {
      const store = newStore(new AesGcmTokenCipher(k1));
      await store.health.waitUntilReady(2000);
      const r = record(token('acme'));
      const key = redisKeys.token('acme-prod');
      const edits: Array<[string, (h: Record<string, string>) => Record<string, string>]> = [
        // An old value kept alive: exp (Redis time) and obt moved a day-minus-a-bit later,
        // the lifetime unchanged; then the same with the writer's expiry moved too.
        [
          'exp and obt',
          (h) => ({
            exp: String(Number(h.exp) + 3_600_000),
            obt: String(Number(h.obt) + 3_600_000),
          }),
        ],
        [
          'exp, obt and wexp',
          (h) => ({
            exp: String(Number(h.exp) + 3_600_000),
            obt: String(Number(h.obt) + 3_600_000),
            wexp: String(Number(h.wexp) + 3_600_000),
          }),
        ],
        ['exp only (a longer lifetime)', (h) => ({ exp: String(Number(h.exp) + 3_600_000) })],
        ['wexp only', (h) => ({ wexp: String(Number(h.wexp) + 3_600_000) })],
        ['the fingerprint', (h) => ({ fp: h.fp.replace(/^./, (c) => (c === '0' ? '1' : '0')) })],
      ];
      for (const [what, edit] of edits) {
        await raw.del(key);
        await store.records.writeFenced('acme-prod', r);
        expect(await store.records.read('acme-prod')).toEqual({ status: 'found', record: r });
        const original = await rawHash(raw, 'acme-prod');
        await raw.hset(key, edit(original));
        await raw.persist(key);
        expect([what, await store.records.read('acme-prod')]).toEqual([
          what,
          { status: 'corrupt' },
        ]);
      }
    });

    it('treats a value in the earliest format (gcm1: no context bound) as unreadable, even under its own fingerprint', async () => {
      const store = newStore(new AesGcmTokenCipher(k1));
      await store.health.waitUntilReady(2000);
      await store.records.writeFenced('acme-prod', record(token('acme')));
      // What an earlier version wrote: the same fields, the client id alone as associated data.
      const { createCipheriv } = await import('node:crypto');
      const iv = randomBytes(12);
      const c = createCipheriv('aes-256-gcm', k1, iv, { authTagLength: 16 });
      c.setAAD(Buffer.from('acme-prod'));
      const old = token('acme');
      const body = Buffer.concat([iv, c.update(old, 'utf8'), c.final(), c.getAuthTag()]);
      const legacy = `gcm1:${new AesGcmTokenCipher(k1).currentKeyId}:${body.toString('base64url')}`;
      const fp = createHash('sha256').update(old).digest('hex').slice(0, 16);
      await raw.hset(redisKeys.token('acme-prod'), 'val', legacy, 'fp', fp);
      expect(await store.records.read('acme-prod')).toEqual({ status: 'corrupt' });
    });

    it('refuses a value put back after a revoke: the generation is bound to it', async () => {
      const store = newStore(new AesGcmTokenCipher(k1));
      await store.health.waitUntilReady(2000);
      const key = redisKeys.token('acme-prod');
      const r = record(token('acme'));
      await store.records.writeFenced('acme-prod', r);
      const before = await rawHash(raw, 'acme-prod');
      expect((await store.bus.revoke('acme-prod')).generation).toBe(1);
      // Someone with write access to Redis puts the revoked token's record back as it was.
      await raw.del(key);
      await raw.hset(key, before);
      expect(await store.records.read('acme-prod')).toEqual({ status: 'corrupt' });
      // The same with the generation key reset too: this replica saw the revoke.
      await raw.del(redisKeys.generation('acme-prod'));
      expect(await store.records.read('acme-prod')).toEqual({ status: 'corrupt' });
      // A token of the new generation is read.
      await raw.set(redisKeys.generation('acme-prod'), '1');
      await raw.del(key);
      const fresh = { ...record(token('acme')), generation: 1 };
      expect(await store.records.writeFenced('acme-prod', fresh)).toBe(true);
      expect(await store.records.read('acme-prod')).toEqual({ status: 'found', record: fresh });
    });
  });

  // In the Jest process, but for a start that must fail: its exit code is a process's.
  describe('brokers', () => {
    let stack: Stack;
    let provider: ProviderEmulator;
    let apiKey: string;
    let brokers: StackBroker[];

    const broker = (name: string, env: Record<string, string> = {}) =>
      stack.addBroker({ name, env });

    async function tokenOf(b: StackBroker, client: string): Promise<string> {
      const res = await fetch(`${b.url}/token?client=${client}`, {
        headers: { authorization: `Bearer ${apiKey}` },
      });
      expect(res.status).toBe(200);
      return ((await res.json()) as { access_token: string }).access_token;
    }

    function keyFile(name: string, content: string): string {
      const file = join(stack.dir, name);
      writeFileSync(file, content, { mode: 0o600 });
      return file;
    }

    beforeAll(async () => {
      await redis.flush();
      stack = await startStack({
        name: 'cache-encryption',
        inProcess: true,
        clients: CLIENTS,
        redis,
        callerAuth: { mode: 'api-key', callers: { checkout: { clients: ['*'] } } },
        cacheKey: `${k1.toString('base64')}\n`,
        // No broker yet: each test starts the ones it needs.
        replicas: 0,
      });
      ({ provider, brokers } = stack);
      apiKey = stack.keys.checkout;
    });

    afterAll(async () => {
      await stack?.close();
    });

    it('keeps the served tokens out of Redis', async () => {
      const b = await broker('broker-a');
      for (const client of CLIENTS) {
        const accessToken = await tokenOf(b, client);
        const hash = await rawHash(raw, client);
        expect(hash.val).toMatch(/^gcm3:/);
        expect(JSON.stringify(hash)).not.toContain(accessToken);
      }
      // Nothing else in Redis holds it either (locks, channels, idempotency records).
      const keys = await raw.keys('*');
      const read = async (k: string): Promise<string | null> => {
        switch (await raw.type(k)) {
          case 'hash':
            return JSON.stringify(await raw.hgetall(k));
          case 'zset':
            return JSON.stringify(await raw.zrange(k, 0, -1, 'WITHSCORES'));
          case 'set':
            return JSON.stringify(await raw.smembers(k));
          default:
            return raw.get(k);
        }
      };
      const values = await Promise.all(keys.map(read));
      for (const t of provider.stats.issued) expect(values.join('\n')).not.toContain(t.token);
    });

    it('discards values swapped between clients and refreshes, never serving the other client its token', async () => {
      const [acme, globex] = await Promise.all([
        rawHash(raw, 'acme-prod'),
        rawHash(raw, 'globex-prod'),
      ]);
      const globexToken = await tokenOf(brokers[0], 'globex-prod');
      const acmeToken = await tokenOf(brokers[0], 'acme-prod');
      await raw.hset(redisKeys.token('acme-prod'), 'val', globex.val);
      await raw.hset(redisKeys.token('globex-prod'), 'val', acme.val);
      const requestsBefore = provider.stats.tokenRequests;

      // A new replica starts by reading Redis: both values fail to open under their client id.
      const b = await broker('broker-b');
      const served = {
        acme: await tokenOf(b, 'acme-prod'),
        globex: await tokenOf(b, 'globex-prod'),
      };
      expect(served.acme).not.toBe(globexToken);
      expect(served.globex).not.toBe(acmeToken);
      expect(served.acme).not.toBe(acmeToken);
      expect(provider.isValidToken(served.acme)).toBe(true);
      expect(provider.isValidToken(served.globex)).toBe(true);
      expect(provider.stats.tokenRequests).toBe(requestsBefore + 2);
      const issuedTo = (t: string) => provider.stats.issued.find((i) => i.token === t)?.clientId;
      expect(issuedTo(served.acme)).toBe(stack.credentials['acme-prod'].client_id);
      expect(issuedTo(served.globex)).toBe(stack.credentials['globex-prod'].client_id);
      await waitFor(
        () => b.logs().filter((l) => l.includes('shared token value is unreadable')).length >= 2,
        { timeoutMs: 5000, what: 'the corrupt values to be reported' },
      );
      // The fresh tokens replaced the swapped values.
      expect((await rawHash(raw, 'acme-prod')).val).not.toBe(globex.val);
    });

    it('adopts the fleet token after a key rotation (new key current, old one still readable)', async () => {
      const current = await tokenOf(brokers[1], 'acme-prod');
      const requestsBefore = provider.stats.tokenRequests;
      const keyring = JSON.stringify({
        current: k2.toString('base64'),
        previous: [k1.toString('base64')],
      });
      const b = await broker('broker-rotated', {
        CACHE_KEY_FILE: keyFile('keyring.json', keyring),
      });
      expect(await tokenOf(b, 'acme-prod')).toBe(current);
      expect(provider.stats.tokenRequests).toBe(requestsBefore);
    });

    it('refuses to start with a malformed key, naming the setting and not the value', async () => {
      const bad = randomBytes(32).toString('hex');
      const b = await stack.addBroker({
        name: 'broker-bad-key',
        inProcess: false,
        wait: 'none',
        env: { CACHE_KEY_FILE: keyFile('bad-key', bad) },
      });
      const exit = await b.process!.exited;
      expect(exit.code).not.toBe(0);
      const out = b.logs().join('\n');
      expect(out).toContain('CACHE_KEY_SECRET_ID / CACHE_KEY_FILE');
      expect(out).toContain('decodes to 48 bytes');
      expect(out).not.toContain(bad);
    });

    it('never logs a token, a client secret, the API key or a cache key', () => {
      const logs = brokers.flatMap((b) => b.logs()).join('\n');
      expect(logs).toContain('"level":"debug"');
      const secrets = [
        ...provider.stats.issued.map((t) => t.token),
        stack.credentials['acme-prod'].client_secret,
        stack.credentials['globex-prod'].client_secret,
        apiKey,
        k1.toString('base64'),
        k2.toString('base64'),
        k1.toString('hex'),
      ];
      expect(secrets.filter((s) => logs.includes(s))).toEqual([]);
    });
  });
});
