import {
  afterFailure,
  failureOf,
  holderWaitMs,
  holding,
  lifecycleOf,
  type LifecycleFacts,
  meets,
  noteLifetime,
  type RefreshPhase,
  refusalOf,
  SETTLED,
} from './token-lifecycle';
import { TokenErrorCode, TokenException } from './token.exception';

const refused = new TokenException(TokenErrorCode.CredentialsRejected, 'credentials refused');

describe('refresh phase', () => {
  it('counts failures from a settled phase, with the last error', () => {
    const once = afterFailure(SETTLED, new Error('timeout'));
    const twice = afterFailure(once, new Error('503'));
    expect(twice).toEqual({
      kind: 'failing',
      failure: { count: 2, lastError: new Error('503'), permanent: undefined },
    });
    expect(failureOf(SETTLED)).toBeUndefined();
  });

  it('keeps a hold through a failure, and the failures through a hold', () => {
    const held = holding(afterFailure(SETTLED, new Error('timeout')), 5000, false);
    expect(held).toMatchObject({ kind: 'backoff', until: 5000, failure: { count: 1 } });
    const floor: RefreshPhase = holding(SETTLED, 7000, true);
    expect(floor).toEqual({ kind: 'floor', until: 7000, failure: undefined });
    expect(afterFailure(floor, new Error('503'))).toMatchObject({
      kind: 'floor',
      until: 7000,
      failure: { count: 1 },
    });
  });

  it('keeps a permanent error through later transient failures', () => {
    const permanent = afterFailure(SETTLED, new Error('401'), refused);
    const after = afterFailure(holding(permanent, 1000, false), new Error('timeout'));
    expect(failureOf(after)).toEqual({
      count: 2,
      lastError: new Error('timeout'),
      permanent: refused,
    });
  });
});

describe('lifecycle', () => {
  const now = 1_000_000;
  const facts = (over: Partial<LifecycleFacts>): LifecycleFacts => ({
    everObtained: true,
    rejected: false,
    revokedPending: false,
    refreshing: false,
    phase: SETTLED,
    now,
    ...over,
  });

  it.each<[string, Partial<LifecycleFacts>, string]>([
    ['nothing ever held', { everObtained: false }, 'empty'],
    ['a valid token, no refresh', { expiresAt: now + 60_000 }, 'fresh'],
    ['a valid token being refreshed', { expiresAt: now + 60_000, refreshing: true }, 'refreshing'],
    [
      'a failure backing off',
      {
        expiresAt: now + 60_000,
        refreshing: true,
        phase: holding(afterFailure(SETTLED, new Error('503')), now + 5000, false),
      },
      'backing_off',
    ],
    [
      'the refresh floor holding',
      { expiresAt: now + 60_000, refreshing: true, phase: holding(SETTLED, now + 5000, true) },
      'backing_off',
    ],
    ['the provider refused it', { expiresAt: now + 60_000, rejected: true }, 'rejected'],
    ['dropped by a revoke', { revokedPending: true, refreshing: true }, 'revoked'],
    ['held past its expiry', { expiresAt: now }, 'expired'],
    ['lost and not replaced', {}, 'expired'],
    [
      'credentials refused',
      {
        expiresAt: now + 60_000,
        phase: afterFailure(SETTLED, new Error('401'), refused),
      },
      'failed',
    ],
  ])('%s: %s', (_what, over, expected) => {
    expect(lifecycleOf(facts(over))).toBe(expected);
  });
});

describe('waiting callers', () => {
  it('a waiter is met by a token lasting past its need and the minimum to serve', () => {
    expect(meets(10_000, 9_000, 5_000)).toBe(true);
    expect(meets(10_000, 11_000, 5_000)).toBe(false);
    // An older need can fall short of "now plus the minimum": the minimum wins.
    expect(meets(10_000, 1_000, 10_001)).toBe(false);
  });

  it('refuses at once what no token can meet in time, and lets the rest wait', () => {
    const base = { phase: SETTLED, minRemainingMs: 0, waitTimeoutMs: 5_000, now: 0 };
    expect(refusalOf(base)).toBeUndefined();
    expect(refusalOf({ ...base, phase: afterFailure(SETTLED, new Error('x'), refused) })).toBe(
      'permanent',
    );
    expect(refusalOf({ ...base, lifetimeMs: 60_000, minRemainingMs: 60_000 })).toBe('lifetime');
    expect(refusalOf({ ...base, lifetimeMs: 60_000, minRemainingMs: 59_000 })).toBeUndefined();
    // Even without min_ttl a token must keep the minimum to serve.
    expect(refusalOf({ ...base, lifetimeMs: 1_000 })).toBe('lifetime');
    expect(refusalOf({ ...base, phase: holding(SETTLED, 5_001, false) })).toBe('hold');
    expect(refusalOf({ ...base, phase: holding(SETTLED, 5_000, true) })).toBeUndefined();
  });

  it('waits for another replica doubling from 100 ms to 1 s, and not at all after news', () => {
    expect([0, 1, 2, 3, 4, 9].map((n) => holderWaitMs(n, false))).toEqual([
      100, 200, 400, 800, 1000, 1000,
    ]);
    expect(holderWaitMs(3, true)).toBe(0);
  });
});

describe('noted lifetime', () => {
  const settings = { minRefreshIntervalMs: 5_000, refreshAheadSeconds: 60 };
  const problem = (ms: number) => `too short: ${ms}`;

  it('reports each condition once when it starts and once when it ends', () => {
    const short = noteLifetime(undefined, 4_000, settings, problem);
    expect(short).toEqual({
      lifetime: { ms: 4_000, problem: 'too short: 4000', leadCapped: true },
      leadCapped: 'on',
      problem: 'on',
    });
    const again = noteLifetime(short.lifetime, 4_000, settings, problem);
    expect([again.leadCapped, again.problem]).toEqual([undefined, undefined]);
    const long = noteLifetime(again.lifetime, 3_600_000, settings, problem);
    expect(long).toEqual({
      lifetime: { ms: 3_600_000, problem: undefined, leadCapped: false },
      leadCapped: 'off',
      problem: 'off',
    });
  });
});
