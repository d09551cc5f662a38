import { RedisClockOffset } from './redis-clock';
import { localExpiry } from './token-records.redis';

describe(localExpiry.name, () => {
  // Redis's clock equals ours; a read sent at 1000 arrived at 1300 (a 300 ms round trip under
  // load) and Redis answered at 1100 with 60 s left: expiry 61_100 in Redis time.
  const expRedis = 61_100;
  const offset = { upper: 1100 - 1000, lower: 1100 - 1300 };

  it('counts from the earliest the offset allows when there is no hint (conservative)', () => {
    expect(localExpiry(expRedis, offset, Number.NaN)).toBe(61_000);
    expect(localExpiry(expRedis, offset, 0)).toBe(61_000);
  });

  it("keeps the writer's exact figure when the offset's bounds cannot tell it from the truth", () => {
    expect(localExpiry(expRedis, offset, 61_150)).toBe(61_150);
    expect(localExpiry(expRedis, offset, 61_300)).toBe(61_300);
    // Millisecond rounding of the two clocks.
    expect(localExpiry(expRedis, offset, 60_998)).toBe(60_998);
  });

  it('ignores the figure of a writer whose clock is off', () => {
    // 30 s ahead: it would make this replica serve the token 30 s too long.
    expect(localExpiry(expRedis, offset, 91_150)).toBe(61_000);
    // 30 s behind, and just outside the bounds either way.
    expect(localExpiry(expRedis, offset, 31_150)).toBe(61_000);
    expect(localExpiry(expRedis, offset, 61_303)).toBe(61_000);
    expect(localExpiry(expRedis, offset, 60_499)).toBe(61_000);
  });

  it("takes a hint up to 500 ms below the bounds: the write's own latency, and earlier is safe", () => {
    expect(localExpiry(expRedis, offset, 60_996)).toBe(60_996);
    expect(localExpiry(expRedis, offset, 60_500)).toBe(60_500);
  });
});

describe(RedisClockOffset.name, () => {
  // Redis's clock is 30 s ahead of this replica's.
  const AHEAD = 30_000;

  it('keeps the tightest recent upper bound, so one slow round trip costs nothing', () => {
    const clock = new RedisClockOffset(60_000);
    // A fast trip: sent 1000, Redis at 1001 (its clock), back at 1002.
    expect(clock.observe(1000, 1002, 1001 + AHEAD)).toEqual({ upper: AHEAD + 1, lower: AHEAD - 1 });
    // A slow one under load: 300 ms round trip. The bound stays the fast trip's.
    expect(clock.observe(5000, 5300, 5150 + AHEAD)).toEqual({
      upper: AHEAD + 1,
      lower: AHEAD - 150,
    });
    // A tighter trip replaces it.
    expect(clock.observe(9000, 9000, 9000 + AHEAD).upper).toBe(AHEAD);
  });

  it('forgets a bound older than maxAgeMs (a stepped clock is trusted again)', () => {
    const clock = new RedisClockOffset(60_000);
    clock.observe(1000, 1001, 1000 + AHEAD);
    // 61 s later the local clock was stepped back by 5 s: the old bound would be wrong.
    expect(clock.observe(62_000, 62_100, 62_050 + AHEAD + 5000).upper).toBe(AHEAD + 5050);
  });

  it('never reports a lower bound above the upper one', () => {
    const clock = new RedisClockOffset(60_000);
    clock.observe(1000, 1000, 1000 + AHEAD);
    // The clocks drifted 20 ms apart since: this trip alone says at least AHEAD + 10.
    const { upper, lower } = clock.observe(2000, 2010, 2020 + AHEAD);
    expect(lower).toBeLessThanOrEqual(upper);
  });
});
