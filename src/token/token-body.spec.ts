import { toRecord } from './token-record';
import { tokenBody } from './token-body';

describe(tokenBody.name, () => {
  const t0 = Date.parse('2026-11-23T00:00:00.000Z');
  const record = toRecord({ accessToken: 'tok-A', obtainedAt: t0, expiresAt: t0 + 1_800_000 });
  const parse = (b: Buffer) => JSON.parse(b.toString('utf8')) as Record<string, unknown>;

  it('answers the remaining lifetime, rounded down, and the absolute expiry', () => {
    expect(parse(tokenBody(record, t0 + 500))).toEqual({
      access_token: 'tok-A',
      token_type: 'Bearer',
      expires_in: 1799,
      expires_at: '2026-11-23T00:30:00.000Z',
    });
  });

  it('shares one buffer within a second and builds a new one when the second changes', () => {
    const a = tokenBody(record, t0 + 10_100);
    const b = tokenBody(record, t0 + 10_900);
    expect(b).toBe(a);
    const c = tokenBody(record, t0 + 11_100);
    expect(c).not.toBe(a);
    expect(parse(a).expires_in).toBe(1789);
    expect(parse(c).expires_in).toBe(1788);
    // The shared buffer is never mutated by a later body.
    expect(parse(a).expires_in).toBe(1789);
  });

  it('builds a new body for a new token in the same second', () => {
    const next = toRecord({ accessToken: 'tok-B', obtainedAt: t0, expiresAt: t0 + 1_800_000 });
    expect(parse(tokenBody(record, t0 + 20_000)).access_token).toBe('tok-A');
    expect(parse(tokenBody(next, t0 + 20_000)).access_token).toBe('tok-B');
  });

  it("keeps each token's body apart: callers spread over clients rebuild none within a second", () => {
    const other = toRecord({ accessToken: 'tok-C', obtainedAt: t0, expiresAt: t0 + 1_800_000 });
    const a = tokenBody(record, t0 + 30_100);
    const c = tokenBody(other, t0 + 30_200);
    expect(tokenBody(record, t0 + 30_300)).toBe(a);
    expect(tokenBody(other, t0 + 30_400)).toBe(c);
  });

  it('never answers a negative lifetime', () => {
    expect(parse(tokenBody(record, t0 + 1_800_500)).expires_in).toBe(0);
  });
});
