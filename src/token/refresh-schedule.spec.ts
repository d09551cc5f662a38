import { isDue, refreshAt, refreshLeadMs, retryDelayMs } from './refresh-schedule';

describe('refresh schedule', () => {
  it('refreshes refreshAhead before expiry for long-lived tokens', () => {
    expect(refreshLeadMs(300_000, 0, 1_800_000)).toBe(300_000);
  });

  it('never leads by more than half the lifetime', () => {
    expect(refreshLeadMs(300_000, 0, 60_000)).toBe(30_000);
  });

  it('subtracts up to a quarter of the lead as jitter, and no more than 30 s', () => {
    expect(refreshAt(300_000, 0, 1_800_000, () => 0)).toBe(1_500_000);
    expect(refreshAt(300_000, 0, 1_800_000, () => 1)).toBe(1_500_000 - 30_000);
    expect(refreshAt(4_000, 0, 10_000, () => 1)).toBe(10_000 - 4_000 - 1_000);
  });

  it('calls a token due from the earliest moment any replica may refresh it', () => {
    // lead 300 s, jitter up to 30 s: due from 330 s before expiry.
    expect(isDue(300_000, 0, 1_800_000, 1_800_000 - 330_001)).toBe(false);
    expect(isDue(300_000, 0, 1_800_000, 1_800_000 - 330_000)).toBe(true);
    // Every timer fires inside the window, whatever its jitter draw.
    for (const draw of [0, 0.5, 1]) {
      const at = refreshAt(4_000, 0, 10_000, () => draw);
      expect(isDue(4_000, 0, 10_000, at)).toBe(true);
    }
    // A token just obtained is never due.
    expect(isDue(300_000, 0, 1_800_000, 0)).toBe(false);
  });

  describe(retryDelayMs.name, () => {
    const base = { baseMs: 500, maxMs: 30_000, now: 0 };

    it('grows exponentially up to the cap (upper bound with random = 1)', () => {
      const delays = [1, 2, 3, 4, 5, 6, 7, 8].map((attempt) =>
        retryDelayMs({ ...base, attempt, random: () => 1 }),
      );
      expect(delays).toEqual([500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]);
    });

    it('uses full jitter: any draw in [0, bound), with a small floor', () => {
      expect(retryDelayMs({ ...base, attempt: 5, random: () => 0.5 })).toBe(4000);
      expect(retryDelayMs({ ...base, attempt: 5, random: () => 0 })).toBe(25);
    });

    it('shrinks the cap to a quarter of the remaining lifetime as expiry nears', () => {
      const far = retryDelayMs({ ...base, attempt: 10, expiresAt: 600_000, random: () => 1 });
      const near = retryDelayMs({ ...base, attempt: 10, expiresAt: 8_000, random: () => 1 });
      expect(far).toBe(30_000);
      expect(near).toBe(2_000);
    });

    it("honours Retry-After even past the token's expiry, up to the largest delay", () => {
      expect(retryDelayMs({ ...base, attempt: 1, retryAfterMs: 5000, random: () => 0 })).toBe(5000);
      // The token expires in 10 s, the provider asks for 15: no attempt before it says.
      const pastExpiry = retryDelayMs({
        ...base,
        attempt: 1,
        retryAfterMs: 15_000,
        expiresAt: 10_000,
        random: () => 0,
      });
      expect(pastExpiry).toBe(15_000);
      // Even with half a second left (where the jittered backoff alone would be 25 ms).
      expect(
        retryDelayMs({ ...base, attempt: 3, retryAfterMs: 3000, now: 9500, expiresAt: 10_000 }),
      ).toBe(3000);
      expect(retryDelayMs({ ...base, attempt: 1, retryAfterMs: 3_600_000, random: () => 0 })).toBe(
        base.maxMs,
      );
    });

    it('keeps the number of attempts within a refresh window bounded', () => {
      // Simulate a 300 s window with the provider down the whole time, worst-case draws.
      let now = 0;
      let attempts = 0;
      const expiresAt = 300_000;
      while (now < expiresAt) {
        attempts++;
        now += retryDelayMs({ ...base, attempt: attempts, now, expiresAt, random: () => 0.5 });
      }
      expect(attempts).toBeGreaterThan(5);
      expect(attempts).toBeLessThan(120);
    });
  });
});
