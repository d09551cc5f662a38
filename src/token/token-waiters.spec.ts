import { type TokenRecord, toRecord } from './token-record';
import { TokenWaiters } from './token-waiters';

function record(name: string, expiresAt: number): TokenRecord {
  return toRecord({ accessToken: name, obtainedAt: 0, expiresAt });
}

describe(TokenWaiters.name, () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('hands a token to the waiters it satisfies and keeps the others waiting', async () => {
    const waiters = new TokenWaiters();
    const short = waiters.wait(1_000, 5_000, () => new Error('timeout'));
    const long = waiters.wait(10_000, 5_000, () => new Error('timeout'));
    expect(waiters.size).toBe(2);
    expect(waiters.allMetBy(record('a', 5_000))).toBe(false);
    waiters.offer(record('a', 5_000));
    await expect(short).resolves.toMatchObject({ accessToken: 'a' });
    expect(waiters.size).toBe(1);
    expect(waiters.allMetBy(record('b', 10_000))).toBe(true);
    waiters.offer(record('b', 10_000));
    await expect(long).resolves.toMatchObject({ accessToken: 'b' });
    expect(waiters.size).toBe(0);
  });

  it('refuses the waiters a token cannot satisfy when told to', async () => {
    const waiters = new TokenWaiters();
    const met = waiters.wait(1_000, 5_000, () => new Error('timeout'));
    const unmet = waiters.wait(10_000, 5_000, () => new Error('timeout'));
    waiters.offer(record('a', 5_000), () => new Error('lifetime too short'));
    await expect(met).resolves.toMatchObject({ accessToken: 'a' });
    await expect(unmet).rejects.toThrow('lifetime too short');
    expect(waiters.size).toBe(0);
  });

  it('times a waiter out with the reason current at that moment, and forgets it', async () => {
    const waiters = new TokenWaiters();
    let reason = 'first';
    const waiting = waiters.wait(1_000, 300, () => new Error(reason));
    reason = 'second';
    jest.advanceTimersByTime(299);
    expect(waiters.size).toBe(1);
    jest.advanceTimersByTime(1);
    await expect(waiting).rejects.toThrow('second');
    expect(waiters.size).toBe(0);
    expect(waiters.allMetBy(record('a', 0))).toBe(true);
  });

  it('rejects every waiter at once and clears their timers', async () => {
    const waiters = new TokenWaiters();
    const all = [1, 2, 3].map((n) => waiters.wait(n, 1_000, () => new Error('timeout')));
    waiters.rejectAll(new Error('shutting down'));
    for (const w of all) await expect(w).rejects.toThrow('shutting down');
    expect(jest.getTimerCount()).toBe(0);
  });

  it('hands out no token with less than the minimum left now, whatever the older need', async () => {
    const waiters = new TokenWaiters();
    const waiting = waiters.wait(1_000, 5_000, () => new Error('timeout'));
    // Enough for the need registered at 0, but not servable at 600 (minimum left: 1 s).
    expect(waiters.allMetBy(record('a', 1_500), 1_600)).toBe(false);
    waiters.offer(record('a', 1_500), undefined, 1_600);
    expect(waiters.size).toBe(1);
    waiters.offer(record('b', 2_000), undefined, 1_600);
    await expect(waiting).resolves.toMatchObject({ accessToken: 'b' });
  });

  it('tells each refused waiter according to its own min_ttl', async () => {
    const waiters = new TokenWaiters();
    const plain = waiters.wait(10_000, 5_000, () => new Error('timeout'));
    const asking = waiters.wait(70_000, 5_000, () => new Error('timeout'), 70_000);
    waiters.rejectAll((requestedMs) => new Error(`min_ttl ${requestedMs}`));
    await expect(plain).rejects.toThrow('min_ttl 0');
    await expect(asking).rejects.toThrow('min_ttl 70000');
  });
});
