import { afterFailure, failureOf, holding, type RefreshPhase, SETTLED } from './refresh-standing';
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
