import { clientPhase, isDue, refreshAt, refreshLeadMs, retryDelayMs } from './refresh-schedule';

/** How far `t` is from the nearest multiple of `width`, in ms. */
function offGrid(t: number, width: number): number {
  const r = ((t % width) + width) % width;
  return Math.min(r, width - r);
}

describe('refresh schedule', () => {
  it('refreshes refreshAhead before expiry for long-lived tokens', () => {
    expect(refreshLeadMs(300_000, 0, 1_800_000)).toBe(300_000);
  });

  it('never leads by more than half the lifetime', () => {
    expect(refreshLeadMs(300_000, 0, 60_000)).toBe(30_000);
  });

  it("refreshes at the client's phase of the spread (a quarter of the lead) before expiresAt - lead", () => {
    // Lead 300 s, spread 75 s: each phase lands on its own point of a 75 s grid.
    const expiresAt = 1_800_000;
    const latest = expiresAt - 300_000;
    for (const phase of [0, 0.25, 0.5, 0.99]) {
      const t = refreshAt(300_000, 0, expiresAt, phase);
      expect(t).toBeLessThanOrEqual(latest);
      expect(t).toBeGreaterThan(latest - 75_000);
      expect(offGrid(t - phase * 75_000, 75_000)).toBeLessThanOrEqual(1);
    }
    // Short tokens: lead 4 s (half the lifetime caps it), spread 1 s.
    const short = refreshAt(4_000, 0, 10_000, 0.5);
    expect(short).toBeLessThanOrEqual(6_000);
    expect(short).toBeGreaterThan(5_000);
  });

  it('keeps a client on the same phase lifetime after lifetime', () => {
    const phase = clientPhase('acme-prod');
    const first = refreshAt(10_000, 0, 60_000, phase);
    // The next token is obtained at that instant and lives as long.
    const second = refreshAt(10_000, first, first + 60_000, phase);
    expect(offGrid(second - first, 2_500)).toBeLessThanOrEqual(1);
    expect(second - first).toBeLessThanOrEqual(50_001);
    expect(second - first).toBeGreaterThan(47_500);
  });

  it('spreads 1000 clients obtained at one instant: the busiest second is within 2x the even share', () => {
    // 60 s tokens refreshed 10 s ahead: a 2.5 s spread, an even share of 400 a second.
    const perSecond = new Map<number, number>();
    for (let i = 0; i < 1000; i++) {
      const t = refreshAt(10_000, 0, 60_000, clientPhase(`merchant-${i}-prod`));
      const second = Math.floor(t / 1000);
      perSecond.set(second, (perSecond.get(second) ?? 0) + 1);
    }
    const busiest = Math.max(...perSecond.values());
    expect(busiest).toBeLessThanOrEqual(2 * (1000 / 2.5));
    // And by 100 ms slots, the even share being 40.
    const perSlot = new Map<number, number>();
    for (let i = 0; i < 1000; i++) {
      const slot = Math.floor(refreshAt(10_000, 0, 60_000, clientPhase(`m-${i}`)) / 100);
      perSlot.set(slot, (perSlot.get(slot) ?? 0) + 1);
    }
    expect(Math.max(...perSlot.values())).toBeLessThanOrEqual(80);
  });

  it('calls a token due from the earliest moment any replica may refresh it', () => {
    // Lead 300 s, spread 75 s: due from 375 s before expiry.
    expect(isDue(300_000, 0, 1_800_000, 1_800_000 - 375_001)).toBe(false);
    expect(isDue(300_000, 0, 1_800_000, 1_800_000 - 375_000)).toBe(true);
    // Every timer fires inside the window, whatever its phase.
    for (const phase of [0, 0.5, 0.999]) {
      const at = refreshAt(4_000, 0, 10_000, phase);
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
