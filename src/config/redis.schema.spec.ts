import { loadConfig } from './config.loader';
import { redisUrlHasPassword, redisUrlHost } from './redis.schema';

const BASE = {
  PROVIDER_AUTH_URL: 'https://auth.example',
  PROVIDER_BASE_URL: 'https://api.example',
  CREDENTIALS_FILE: '/creds.json',
};

/** The problems loadConfig reports, one per line. */
function problems(env: Record<string, string>): string {
  try {
    loadConfig(env);
  } catch (err) {
    return (err as Error).message;
  }
  return '';
}

describe('redis.url', () => {
  it.each([
    ['redis://cache:6379', 'cache'],
    ['rediss://:pw@master.cache.example:6379/0', 'master.cache.example'],
    ['redis://user:p@ss@host:6380', 'host'],
    ['redis://[::1]:6379', '::1'],
    ['redis://[::1]', '::1'],
    ['redis://host', 'host'],
    ['redis://:6379', ''],
    ['redis:///0', ''],
    ['rediss://:secret@:6379/0', ''],
    ['redis://user:secret@/0', ''],
  ])('reads the host of %s as ioredis does', (url, host) => {
    expect(redisUrlHost(url)).toBe(host);
  });

  it.each([
    ['rediss://:pw@cache:6379', true],
    ['redis://user:pw@cache', true],
    ['redis://user@cache', false],
    ['redis://cache:6379', false],
    ['redis://cache/0?x=a:b@c', false],
  ])('tells whether %s carries a password', (url, expected) => {
    expect(redisUrlHasPassword(url)).toBe(expected);
  });

  it.each(['redis://:6379', 'redis:///0', 'rediss://:DO-NOT-PRINT@:6379/0', 'redis://'])(
    'refuses %s, which names no host, naming REDIS_URL and never the password',
    (url) => {
      const found = problems({ ...BASE, REDIS_URL: url });
      expect(found).toContain('REDIS_URL: names no host');
      expect(found).not.toContain('DO-NOT-PRINT');
    },
  );
});
