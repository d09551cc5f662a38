import { HeldToken } from './held-token';
import { type TokenRecord, toRecord, withGeneration } from './token-record';

/** A token named `name`, obtained at 0 and expiring at `expiresAt`. */
function record(name: string, expiresAt: number, generation = 0): TokenRecord {
  return withGeneration(toRecord({ accessToken: name, obtainedAt: 0, expiresAt }), generation);
}

function held(): { token: HeldToken; clock: { now: number } } {
  const clock = { now: 10_000 };
  const token = new HeldToken(() => clock.now);
  return { token, clock };
}

describe(HeldToken.name, () => {
  it('serves the token only while it has the minimum left, and the caller its min_ttl', () => {
    const { token, clock } = held();
    expect(token.servable(0)).toBeUndefined();
    const r = record('a', 20_000);
    token.keep(r);
    expect(token.servable(5_000)).toBe(r);
    expect(token.servable(10_001)).toBeUndefined();
    // Less than the minimum left (a second): never served, though not yet expired.
    clock.now = 19_500;
    expect(token.servable(0)).toBeUndefined();
    expect(token.valid()).toBe(r);
    clock.now = 20_000;
    expect(token.valid()).toBeUndefined();
    expect(token.current).toBe(r);
  });

  it('replaces the token only with one that expires at least as late', async () => {
    const { token } = held();
    expect(token.everObtained).toBe(false);
    const first = record('a', 40_000);
    expect(token.keep(first)).toBe(first);
    expect(token.everObtained).toBe(true);
    expect(token.keep(record('older', 30_000))).toBe(first);
    // The same token read again (another object) keeps the one held.
    expect(token.keep(record('a', 40_000))).toBe(first);
    const later = record('b', 50_000);
    expect(token.outlastedBy(later)).toBe(true);
    expect(token.keep(later)).toBe(later);
    // A forced refresh's token is held even if it expires sooner.
    const forced = record('c', 45_000);
    expect(token.keep(forced, true)).toBe(forced);
  });

  it('keeps a rejected token for GET /token, never forwards it, and replaces it with any acceptable one', async () => {
    const { token, clock } = held();
    const a = record('a', 40_000);
    token.keep(a);
    expect(token.reject(record('other', 40_000).fingerprint)).toBe(false);
    expect(token.current).toBe(a);
    clock.now += 1;
    expect(token.reject(a.fingerprint)).toBe(true);
    expect(token.current).toBe(a);
    expect(token.servable(0)).toBe(a);
    expect(token.forwardable(0)).toBeUndefined();
    expect(token.mayHold(a)).toBe(false);
    // Even one that expires sooner replaces the refused token.
    const b = record('b', 20_000);
    expect(token.mayHold(b)).toBe(true);
    token.keep(b);
    expect(token.current).toBe(b);
    expect(token.forwardable(0)).toBe(b);
  });

  it('takes the same token again when the provider granted it after the refusal', () => {
    const { token, clock } = held();
    const a = record('same', 40_000);
    token.keep(a);
    clock.now += 1;
    token.reject(a.fingerprint);
    expect(token.isRejected(a)).toBe(true);
    expect(token.reissued(a)).toBe(false);
    clock.now += 1;
    const again = { ...a, obtainedAt: clock.now };
    expect(token.isRejected(again)).toBe(false);
    expect(token.reissued(again)).toBe(true);
    expect(token.mayHold(again)).toBe(true);
    token.keep(again);
    expect(token.forwardable(0)).toBe(again);
  });

  it('on a revoke, drops and refuses tokens of older generations, the set-aside one too', () => {
    const { token } = held();
    const old = record('old', 40_000, 1);
    const aside = record('aside', 40_000, 1);
    token.keep(old);
    expect(token.revoke(2, aside)).toBe(old);
    expect(token.generation).toBe(2);
    expect(token.current).toBeUndefined();
    expect(token.mayHold(old)).toBe(false);
    expect(token.isRejected(aside)).toBe(true);
    const current = record('new', 40_000, 2);
    expect(token.ofGeneration(current)).toBe(true);
    token.keep(current);
    expect(token.revoke(2)).toBeUndefined();
    expect(token.current).toBe(current);
  });

  it('restores a set-aside token unless replaced or revoked meanwhile', () => {
    const { token } = held();
    const a = record('a', 40_000, 1);
    token.keep(a);
    token.setAside();
    expect(token.current).toBeUndefined();
    token.restore(a);
    expect(token.current).toBe(a);

    token.setAside();
    const b = record('b', 50_000, 1);
    token.keep(b);
    token.restore(a);
    expect(token.current).toBe(b);

    token.setAside();
    token.revoke(2);
    token.restore(b);
    expect(token.current).toBeUndefined();
  });

  it('records how the last refresh went, at the clock time', () => {
    const { token, clock } = held();
    expect(token.lastRefresh).toBeUndefined();
    clock.now = 12_345;
    token.noteRefresh('failed');
    expect(token.lastRefresh).toEqual({ at: 12_345, outcome: 'failed' });
  });
});
