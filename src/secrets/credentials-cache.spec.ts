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

  describe('rotate', () => {
    const refusal = new Error('invalid_client');
    const isRefusal = (e: unknown): e is Error => e === refusal;
    /** A server that accepts only `accepted`, recording what it was sent. */
    const server = (accepted: ClientCredentials) => {
      const sent: ClientCredentials[] = [];
      const attempt = async (c: ClientCredentials) => {
        sent.push(c);
        if (c.clientSecret !== accepted.clientSecret) throw refusal;
        return `token for ${c.clientSecret}`;
      };
      return { sent, attempt };
    };
    const THIRD = { clientId: 'acme', clientSecret: 'three' };

    it('uses the re-read current version when the source changed (a file)', async () => {
      const cache = new CredentialsCache(source(FIRST, SECOND).load, 10_000, clock);
      const refused = await cache.get();
      const { sent, attempt } = server(SECOND);
      await expect(cache.rotate(refused, attempt, isRefusal)).resolves.toEqual({
        result: 'token for two',
      });
      expect(sent).toEqual([SECOND]);
    });

    it('returns undefined when the source still holds the refused credentials', async () => {
      const { load, calls } = source(FIRST);
      const cache = new CredentialsCache(load, 10_000, clock);
      const refused = await cache.get();
      const { sent, attempt } = server(SECOND);
      await expect(cache.rotate(refused, attempt, isRefusal)).resolves.toBeUndefined();
      expect(calls.count).toBe(2);
      expect(sent).toEqual([]);
    });

    /** A Secrets Manager secret by staging label; a missing label is NotFound. */
    const staged = (stages: Record<string, ClientCredentials>) => {
      const read: string[] = [];
      const load = (stage = 'AWSCURRENT') => {
        read.push(stage);
        const value = stages[stage];
        return value ? Promise.resolve(value) : Promise.reject(notFound());
      };
      return { load, read };
    };
    const STAGES = ['AWSPENDING', 'AWSPREVIOUS'];

    it('tries AWSCURRENT, then AWSPENDING, then AWSPREVIOUS, keeping the first accepted', async () => {
      const { load, read } = staged({ AWSCURRENT: FIRST, AWSPENDING: SECOND, AWSPREVIOUS: THIRD });
      const cache = new CredentialsCache(load, 10_000, clock, STAGES);
      const refused = await cache.get();
      const { sent, attempt } = server(THIRD);
      await expect(cache.rotate(refused, attempt, isRefusal)).resolves.toEqual({
        result: 'token for three',
        stage: 'AWSPREVIOUS',
      });
      expect(read).toEqual(['AWSCURRENT', 'AWSCURRENT', 'AWSPENDING', 'AWSPREVIOUS']);
      // The current version was the refused one: not sent again.
      expect(sent).toEqual([SECOND, THIRD]);
      await expect(cache.get()).resolves.toEqual(THIRD);
    });

    it('skips a staging label that does not exist', async () => {
      const { load } = staged({ AWSCURRENT: FIRST, AWSPREVIOUS: SECOND });
      const cache = new CredentialsCache(load, 10_000, clock, STAGES);
      const refused = await cache.get();
      const { attempt } = server(SECOND);
      await expect(cache.rotate(refused, attempt, isRefusal)).resolves.toMatchObject({
        stage: 'AWSPREVIOUS',
      });
    });

    it('throws the last refusal when every other version is refused too', async () => {
      const { load } = staged({ AWSCURRENT: FIRST, AWSPENDING: SECOND, AWSPREVIOUS: FIRST });
      const cache = new CredentialsCache(load, 10_000, clock, STAGES);
      const refused = await cache.get();
      const { sent, attempt } = server(THIRD);
      await expect(cache.rotate(refused, attempt, isRefusal)).rejects.toBe(refusal);
      expect(sent).toEqual([SECOND]);
    });

    it('keeps the accepted stage at each re-read while AWSCURRENT is the refused version', async () => {
      const stages: Record<string, ClientCredentials> = { AWSCURRENT: FIRST, AWSPENDING: SECOND };
      const { load, read } = staged(stages);
      const cache = new CredentialsCache(load, 10_000, clock, STAGES);
      const refused = await cache.get();
      const { sent, attempt } = server(SECOND);
      await cache.rotate(refused, attempt, isRefusal);
      // A half-finished rotation: the re-read finds AWSCURRENT unchanged, keeps AWSPENDING.
      read.length = 0;
      now = 10_000;
      await expect(cache.get()).resolves.toEqual(SECOND);
      expect(read).toEqual(['AWSCURRENT', 'AWSPENDING']);
      expect(sent).toEqual([SECOND]);
      // Promoted: AWSCURRENT changed, so the re-read reads it alone from then on.
      stages.AWSCURRENT = SECOND;
      delete stages.AWSPENDING;
      now = 20_000;
      read.length = 0;
      await expect(cache.get()).resolves.toEqual(SECOND);
      now = 30_000;
      await expect(cache.get()).resolves.toEqual(SECOND);
      expect(read).toEqual(['AWSCURRENT', 'AWSCURRENT']);
    });

    it('goes back to AWSCURRENT when the accepted stage is gone (a cancelled rotation)', async () => {
      const stages: Record<string, ClientCredentials> = { AWSCURRENT: FIRST, AWSPENDING: SECOND };
      const { load } = staged(stages);
      const cache = new CredentialsCache(load, 10_000, clock, STAGES);
      const refused = await cache.get();
      await cache.rotate(refused, server(SECOND).attempt, isRefusal);
      delete stages.AWSPENDING;
      now = 10_000;
      await expect(cache.get()).resolves.toEqual(FIRST);
    });

    it('passes any other failure through at once', async () => {
      const { load } = staged({ AWSCURRENT: FIRST, AWSPENDING: SECOND, AWSPREVIOUS: THIRD });
      const cache = new CredentialsCache(load, 10_000, clock, STAGES);
      const refused = await cache.get();
      const down = new Error('timeout');
      const attempt = jest.fn(() => Promise.reject(down));
      await expect(cache.rotate(refused, attempt, isRefusal)).rejects.toBe(down);
      expect(attempt).toHaveBeenCalledTimes(1);
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
