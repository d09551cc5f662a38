import { VerifiedTokenCache } from './verified-token.cache';

describe(VerifiedTokenCache.name, () => {
  it('returns a value until its expiry, then forgets it', () => {
    const cache = new VerifiedTokenCache<string>(10);
    cache.set('a', 'caller-a', 1000);
    expect(cache.get('a', 999)).toBe('caller-a');
    expect(cache.get('a', 1000)).toBeUndefined();
    expect(cache.size).toBe(0);
  });

  it('stays within its capacity, evicting the oldest entry first', () => {
    const cache = new VerifiedTokenCache<number>(3);
    for (let i = 0; i < 10; i++) cache.set(`k${i}`, i, 10_000);
    expect(cache.size).toBe(3);
    expect(cache.get('k6', 0)).toBeUndefined();
    expect([7, 8, 9].map((i) => cache.get(`k${i}`, 0))).toEqual([7, 8, 9]);
  });
});
