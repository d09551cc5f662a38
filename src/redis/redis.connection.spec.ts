import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ClusterOptions, RedisOptions } from 'ioredis';
import { redisSettingsSchema } from '../config/redis.schema';
import {
  connectionPlan,
  credentialsSource,
  isReadOnlyError,
  parseHostPort,
  readRedisSecrets,
} from './redis.connection';

const dir = mkdtempSync(join(tmpdir(), 'tb-redis-conn-'));
const ca = join(dir, 'ca.crt');
writeFileSync(ca, 'CA PEM');

/** The plan for `raw` settings: what would be constructed, without connecting anywhere. */
function planOf(raw: Record<string, unknown>, secrets = {}) {
  return connectionPlan(redisSettingsSchema.parse(raw), 'command', secrets);
}

describe(connectionPlan.name, () => {
  it('standalone: one Redis with ACL user, password and TLS options; no offline queue', () => {
    const plan = planOf(
      {
        url: 'redis://127.0.0.1:1',
        username: 'tb',
        password: { file: '/p' },
        tls: { enabled: true, caFile: ca, serverName: 'cache.example' },
      },
      { password: 'pw' },
    );
    expect(plan).toMatchObject({ kind: 'redis', url: 'redis://127.0.0.1:1' });
    const o = plan.options as RedisOptions;
    expect(o).toMatchObject({
      username: 'tb',
      password: 'pw',
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
    });
    expect(o.tls).toMatchObject({ servername: 'cache.example', ca: Buffer.from('CA PEM') });
    // A demoted master's READONLY reconnects (2: and resends), nothing else does.
    const readonly = new Error("READONLY You can't write against a read only replica.");
    expect(o.reconnectOnError?.(readonly)).toBe(2);
    expect(o.reconnectOnError?.(new Error('ERR something'))).toBe(false);
  });

  it('sentinel: sentinels, master name, sentinel auth, TLS to the sentinels, failover detector', () => {
    const plan = planOf(
      {
        mode: 'sentinel',
        sentinel: {
          nodes: ['127.0.0.1:1', '[::1]:2'],
          masterName: 'tokens',
          username: 'sen',
          password: { file: '/s' },
        },
        tls: { enabled: true, caFile: ca },
      },
      { sentinelPassword: 'spw' },
    );
    expect(plan.kind).toBe('redis');
    const o = plan.options as RedisOptions;
    expect(o).toMatchObject({
      sentinels: [
        { host: '127.0.0.1', port: 1 },
        { host: '::1', port: 2 },
      ],
      name: 'tokens',
      sentinelUsername: 'sen',
      sentinelPassword: 'spw',
      enableTLSForSentinelMode: true,
      failoverDetector: true,
    });
    expect(o.sentinelTLS).toMatchObject({ ca: Buffer.from('CA PEM') });
  });

  it('cluster: a Cluster reading masters only, auth and TLS per node, DNS left to TLS', () => {
    const plan = planOf(
      {
        mode: 'cluster',
        cluster: { nodes: ['127.0.0.1:1'] },
        username: 'tb',
        tls: { enabled: true },
      },
      { password: 'pw' },
    );
    expect(plan).toMatchObject({ kind: 'cluster', nodes: [{ host: '127.0.0.1', port: 1 }] });
    const o = plan.options as ClusterOptions;
    expect(o).toMatchObject({ scaleReads: 'master', enableOfflineQueue: false });
    expect(o.redisOptions).toMatchObject({ username: 'tb', password: 'pw', commandTimeout: 500 });
    expect(o.redisOptions?.tls).toBeDefined();
    const resolved = jest.fn();
    (o.dnsLookup as (a: string, cb: typeof resolved) => void)(
      'clustercfg.example.cache.amazonaws.com',
      resolved,
    );
    expect(resolved).toHaveBeenCalledWith(null, 'clustercfg.example.cache.amazonaws.com');
  });
});

describe(readRedisSecrets.name, () => {
  it('reads both passwords by reference, without a trailing newline', async () => {
    const read = jest.fn((ref: { file?: string; secretId?: string }) =>
      Promise.resolve(ref.file === '/p' ? 'data-pw\n' : 'sentinel-pw'),
    );
    const settings = redisSettingsSchema.parse({
      mode: 'sentinel',
      sentinel: { nodes: ['s:26379'], masterName: 'm', password: { secretId: 'redis/sentinel' } },
      password: { file: '/p' },
    });
    expect(await readRedisSecrets(settings, { read })).toEqual({
      password: 'data-pw',
      sentinelPassword: 'sentinel-pw',
    });
    expect(read).toHaveBeenCalledWith({ secretId: 'redis/sentinel' });
  });
});

describe('helpers', () => {
  it('parses host:port, IPv6 in brackets', () => {
    expect(parseHostPort('cache:6379')).toEqual({ host: 'cache', port: 6379 });
    expect(parseHostPort('[fd00::1]:7000')).toEqual({ host: 'fd00::1', port: 7000 });
  });

  it('recognises READONLY replies only', () => {
    expect(isReadOnlyError(new Error("READONLY You can't write"))).toBe(true);
    expect(isReadOnlyError(new Error('ERR READONLY-ish'))).toBe(false);
  });
});

describe(credentialsSource.name, () => {
  const of = (raw: Record<string, unknown>) => credentialsSource(redisSettingsSchema.parse(raw));

  it('names the URL when it carries the password, since ioredis lets it win', () => {
    expect(of({ url: 'rediss://:pw@cache:6379' })).toBe(
      'the user and password in REDIS_URL (redis.url)',
    );
    expect(of({ url: 'rediss://:pw@cache:6379', password: { file: '/p' } })).toContain(
      'which win over REDIS_PASSWORD_FILE',
    );
  });

  it('names the password file or secret otherwise, and says when there is none', () => {
    expect(of({ url: 'rediss://cache:6379', password: { file: '/p' } })).toContain(
      'REDIS_PASSWORD_FILE (redis.password.file)',
    );
    expect(of({ url: 'rediss://user@cache:6379', password: { secretId: 'redis/pw' } })).toContain(
      'REDIS_PASSWORD_SECRET_ID (redis.password.secretId)',
    );
    expect(of({ mode: 'cluster', cluster: { nodes: ['c:6379'] } })).toContain(
      'no password is configured',
    );
  });
});
