import pino from 'pino';
import { AuditTrail } from './audit-trail';

/** The budget alone: no report is due within a case. */
function budget(refusalsPerSecond: number): AuditTrail {
  return new AuditTrail(pino({ level: 'silent' }), 'test', {
    refusalsPerSecond,
    intervalSeconds: 3600,
  });
}

describe(AuditTrail.name, () => {
  it('admits at most perSecond lines a second and counts every other one', () => {
    const limit = budget(3);
    const t0 = 1_000_000;
    const admitted = [0, 1, 2, 3, 4, 5].map((i) => limit.admit(i % 2 ? 'forbidden' : 'x', t0 + i));
    expect(admitted).toEqual([true, true, true, false, false, false]);
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
    const limit = budget(50);
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

  it('gives refusals of no authenticated caller one budget and each authenticated caller its own', () => {
    const limit = budget(2);
    const t0 = 1_000_000;
    // An unauthenticated flood uses up its own budget only.
    const flood = Array.from({ length: 400 }, () => limit.admit('unauthenticated', t0));
    expect(flood.filter(Boolean)).toHaveLength(2);
    // A real caller's refusal in the same second is still written, and another caller's too.
    expect(limit.admit('forbidden', t0 + 1, { caller: 'checkout', client: 'globex-prod' })).toBe(
      true,
    );
    expect(limit.admit('forbidden', t0 + 1, { caller: 'billing', client: 'acme-prod' })).toBe(true);
    // A caller's own loop uses up its budget; what it loses is named in the report.
    expect(limit.admit('forbidden', t0 + 2, { caller: 'checkout', client: 'globex-prod' })).toBe(
      true,
    );
    expect(limit.admit('forbidden', t0 + 3, { caller: 'checkout', client: 'globex-prod' })).toBe(
      false,
    );
    expect(limit.admit('forbidden', t0 + 3, { caller: 'billing', client: 'acme-prod' })).toBe(true);
    expect(limit.takeSuppressed()).toEqual({
      suppressed: 399,
      results: { unauthenticated: 398, forbidden: 1 },
      callers: { checkout: 1 },
      clients: { 'globex-prod': 1 },
      first: t0,
      last: t0 + 3,
    });
  });

  it('names at most 20 clients in a report, counting the rest together', () => {
    const limit = budget(1);
    for (let i = 0; i < 30; i++) limit.admit('forbidden', 0, { caller: 'c', client: `x${i}` });
    limit.admit('forbidden', 0, { caller: 'c', client: '__proto__' });
    const clients = limit.takeSuppressed()!.clients!;
    expect(Object.keys(clients)).toHaveLength(21);
    expect(clients['(others)']).toBe(10);
  });
});
