import type { ClientCredentials } from './client-credentials';
import { CredentialsCache } from './credentials-cache';
import { SecretsErrorCode, SecretsException } from './secrets.exception';

const FIRST = { clientId: 'acme', clientSecret: 'one' };
const SECOND = { clientId: 'acme', clientSecret: 'two' };

/** A credentials source that answers from a script: credentials, or an error to throw. */
function source(...script: Array<ClientCredentials | Error>) {
  const calls = { count: 0 };
  const load = (): Promise<ClientCredentials> => {
    calls.count++;
    const next = script.length > 1 ? script.shift()! : script[0];
    return next instanceof Error ? Promise.reject(next) : Promise.resolve(next);
  };
  return { load, calls };
}

const unavailable = () =>
  new SecretsException(SecretsErrorCode.Unavailable, 'throttled', { source: 's' });
const notFound = () =>
  new SecretsException(SecretsErrorCode.NotFound, 'no such secret', { source: 's' });

describe(CredentialsCache.name, () => {
  let now = 0;
  const clock = () => now;
  beforeEach(() => (now = 0));

  it('reads once, then again only after maxAgeMs', async () => {
    const { load, calls } = source(FIRST, SECOND);
    const cache = new CredentialsCache(load, 10_000, clock);
    await expect(cache.get()).resolves.toEqual(FIRST);
    now = 9_999;
    await expect(cache.get()).resolves.toEqual(FIRST);
    expect(calls.count).toBe(1);
    now = 10_000;
    await expect(cache.get()).resolves.toEqual(SECOND);
    expect(calls.count).toBe(2);
  });

  it('re-reads when forced', async () => {
    const { load, calls } = source(FIRST, SECOND);
    const cache = new CredentialsCache(load, 10_000, clock);
    await cache.get();
    await expect(cache.get(true)).resolves.toEqual(SECOND);
    expect(calls.count).toBe(2);
  });

  it('keeps the last good credentials through a transient source failure', async () => {
    const { load } = source(FIRST, unavailable());
    const cache = new CredentialsCache(load, 10_000, clock);
    await cache.get();
    await expect(cache.get(true)).resolves.toEqual(FIRST);
  });

  it('throws a permanent source failure, and any failure before the first read', async () => {
    const cache = new CredentialsCache(source(FIRST, notFound()).load, 10_000, clock);
    await cache.get();
    await expect(cache.get(true)).rejects.toMatchObject({ code: SecretsErrorCode.NotFound });
    const cold = new CredentialsCache(source(unavailable()).load, 10_000, clock);
    await expect(cold.get()).rejects.toMatchObject({ code: SecretsErrorCode.Unavailable });
  });

  describe('rotated', () => {
    it('returns the new credentials when the source changed', async () => {
      const cache = new CredentialsCache(source(FIRST, SECOND).load, 10_000, clock);
      const refused = await cache.get();
      await expect(cache.rotated(refused)).resolves.toEqual(SECOND);
    });

    it('returns undefined when the source still holds the refused credentials', async () => {
      const { load, calls } = source(FIRST);
      const cache = new CredentialsCache(load, 10_000, clock);
      const refused = await cache.get();
      await expect(cache.rotated(refused)).resolves.toBeUndefined();
      expect(calls.count).toBe(2);
    });
  });

  it('reloads now on demand, saying whether the credentials changed; a failure keeps them', async () => {
    const { load, calls } = source(FIRST, FIRST, SECOND, unavailable());
    const cache = new CredentialsCache(load, 3_600_000, clock);
    await expect(cache.reload()).resolves.toBe('first');
    await expect(cache.reload()).resolves.toBe('unchanged');
    await expect(cache.reload()).resolves.toBe('changed');
    await expect(cache.get()).resolves.toEqual(SECOND);
    await expect(cache.reload()).rejects.toBeInstanceOf(SecretsException);
    await expect(cache.get()).resolves.toEqual(SECOND);
    expect(calls.count).toBe(4);
  });
});
