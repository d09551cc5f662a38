import {
  clientPhase,
  isDue,
  refreshAt,
  refreshLeadMs,
  retryDelayMs,
  shortestRefreshMs,
} from './refresh-schedule';

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

  it("refreshes at the client's phase of a window one lead wide before expiresAt - lead", () => {
    // 30 min tokens, lead 300 s: each phase lands on its own point of a 300 s grid.
    const expiresAt = 1_800_000;
    const latest = expiresAt - 300_000;
    for (const phase of [0, 0.25, 0.5, 0.99]) {
      const t = refreshAt(300_000, 0, expiresAt, phase);
      expect(t).toBeLessThanOrEqual(latest);
      expect(t).toBeGreaterThan(latest - 300_000);
      expect(offGrid(t - phase * 300_000, 300_000)).toBeLessThanOrEqual(1);
    }
    // Short tokens: lead 5 s (half the lifetime caps it), a window of half the 5 s period.
    for (const phase of [0, 0.5, 0.99]) {
      const short = refreshAt(8_000, 0, 10_000, phase);
      expect(short).toBeLessThanOrEqual(5_000);
      expect(short).toBeGreaterThan(2_500);
    }
  });

  it('keeps a client on the same phase lifetime after lifetime, one refresh per lifetime', () => {
    const phase = clientPhase('acme-prod');
    const first = refreshAt(10_000, 0, 60_000, phase);
    expect(first).toBeGreaterThan(40_000);
    // The next token is obtained at that instant, or a little later (the lock, the provider).
    for (const delayMs of [0, 40, 900]) {
      const obtained = first + delayMs;
      const second = refreshAt(10_000, obtained, obtained + 60_000, phase);
      expect(second - first).toBe(50_000);
    }
  });

  /** The busiest second of `n` clients' refreshes over `lifetimes`, all obtained at 0. */
  function busiestSecond(n: number, lifetimeMs: number, aheadMs: number, lifetimes: number) {
    const perSecond = new Map<number, number>();
    let minGap = Infinity;
    for (let i = 0; i < n; i++) {
      const phase = clientPhase(`merchant-${i}-prod`);
      let obtained = 0;
      for (let k = 0; k < lifetimes; k++) {
        const at = refreshAt(aheadMs, obtained, obtained + lifetimeMs, phase);
        const s = Math.floor(at / 1000);
        perSecond.set(s, (perSecond.get(s) ?? 0) + 1);
        minGap = Math.min(minGap, at - obtained);
        // The new token is obtained a little after the refresh starts (the lock, the provider).
        obtained = at + (i % 7) * 100;
      }
    }
    return { busiest: Math.max(...perSecond.values()), minGap };
  }

  it('spreads 1000 clients obtained at one instant: the busiest second within 2x the even share', () => {
    // 60 s tokens refreshed 10 s ahead: the refresh window is the lead, an even share of 100 a
    // second, lifetime after lifetime; no token refreshed before it lived 40 s.
    const spread = busiestSecond(1000, 60_000, 10_000, 6);
    console.log(`[spread] 1000 clients, 60 s tokens 10 s ahead: busiest second ${spread.busiest}`);
    expect(spread.busiest).toBeLessThanOrEqual(2 * (1000 / 10));
    expect(spread.minGap).toBeGreaterThan(40_000);
    // 30 min tokens refreshed 5 min ahead: an even share of 3.3 a second.
    const prod = busiestSecond(1000, 1_800_000, 300_000, 4);
    expect(prod.busiest).toBeLessThanOrEqual(Math.ceil(2 * (1000 / 300)) + 3);
  });

  it('never refreshes a token sooner than the shortest refresh, and reaches it', () => {
    // The fault tests' settings (4 s / 2 s ahead, 6 s / 2 s, 4 s / 1 s) and production's.
    const cases: [aheadMs: number, lifetimeMs: number, shortestMs: number][] = [
      [2_000, 4_000, 1_000],
      [2_000, 6_000, 2_000],
      [1_000, 4_000, 2_000],
      [300_000, 1_800_000, 1_200_000],
    ];
    for (const [aheadMs, lifetimeMs, shortestMs] of cases) {
      expect(shortestRefreshMs(aheadMs, lifetimeMs)).toBe(shortestMs);
      let seen = Infinity;
      for (let i = 0; i < 200; i++) {
        const phase = clientPhase(`merchant-${i}`);
        // Obtained at any instant of the grid, on it or off it.
        const obtained = 1_000_000 + i * 37;
        seen = Math.min(
          seen,
          refreshAt(aheadMs, obtained, obtained + lifetimeMs, phase) - obtained,
        );
      }
      expect(seen).toBeGreaterThanOrEqual(shortestMs);
      expect(seen).toBeLessThan(shortestMs + 0.05 * lifetimeMs);
    }
  });

  it('calls a token due once its refresh time has come, on every replica alike', () => {
    const token = { obtainedAt: 0, expiresAt: 1_800_000 };
    for (const phase of [0, 0.3, 0.999]) {
      const at = refreshAt(300_000, 0, 1_800_000, phase);
      expect(isDue(300_000, token, phase, at - 51)).toBe(false);
      // A timer may fire a millisecond early: due from just before.
      expect(isDue(300_000, token, phase, at - 50)).toBe(true);
      expect(isDue(300_000, token, phase, at)).toBe(true);
    }
    // A token just obtained is never due.
    expect(isDue(300_000, token, 0.5, 0)).toBe(false);
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
