import { AuditRateLimit } from './audit-rate-limit';

describe(AuditRateLimit.name, () => {
  it('admits at most perSecond lines a second and counts every other one', () => {
    const limit = new AuditRateLimit(3);
    const t0 = 1_000_000;
    const admitted = [0, 1, 2, 3, 4, 5].map((i) => limit.admit(i % 2 ? 'forbidden' : 'x', t0 + i));
    expect(admitted).toEqual([true, true, true, false, false, false]);
    expect(limit.hasSuppressed).toBe(true);
    expect(limit.takeSuppressed()).toEqual({
      suppressed: 3,
      results: { forbidden: 2, x: 1 },
      first: t0 + 3,
      last: t0 + 5,
    });
    expect(limit.takeSuppressed()).toBeUndefined();
    // A new window a second later.
    expect(limit.admit('x', t0 + 999)).toBe(false);
    expect(limit.admit('x', t0 + 1000)).toBe(true);
    expect(limit.takeSuppressed()?.suppressed).toBe(1);
  });

  it('bounds a flood: lines written plus lines counted equal the events', () => {
    const limit = new AuditRateLimit(50);
    let written = 0;
    let counted = 0;
    for (let i = 0; i < 100_000; i++) {
      if (limit.admit('unauthenticated', Math.floor(i / 10))) written++;
      if (i % 977 === 0) counted += limit.takeSuppressed()?.suppressed ?? 0;
    }
    counted += limit.takeSuppressed()?.suppressed ?? 0;
    // 10,000 ms of events: 10 windows of 50 lines.
    expect(written).toBe(500);
    expect(written + counted).toBe(100_000);
  });
});
