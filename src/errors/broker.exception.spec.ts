import { CallerAuthErrorCode, CallerAuthException } from '../caller-auth/caller-auth.exception';
import { ConfigErrorCode, ConfigException } from '../config/config.exception';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { SecretsErrorCode, SecretsException } from '../secrets/secrets.exception';
import { TokenErrorCode, TokenException } from '../token/token.exception';
import { BrokerException } from './broker.exception';

describe(BrokerException.name, () => {
  it('carries the code, the message, the cause and the retry hint, named after the domain', () => {
    const cause = new Error('redis timed out');
    const err = new TokenException(TokenErrorCode.Unavailable, 'no token in time', {
      cause,
      retryAfterSeconds: 3,
    });
    expect(err).toBeInstanceOf(BrokerException);
    expect(err).toBeInstanceOf(Error);
    expect(err.name).toBe('TokenException');
    expect(err.code).toBe(TokenErrorCode.Unavailable);
    expect(err.message).toBe('no token in time');
    expect(err.cause).toBe(cause);
    expect(err.retryAfterSeconds).toBe(3);
  });

  it('has no cause property at all when none is given, as before the common base', () => {
    const err = new CallerAuthException(CallerAuthErrorCode.Forbidden, 'not granted');
    expect('cause' in err).toBe(false);
    expect(err.retryAfterSeconds).toBeUndefined();
    expect(err.name).toBe('CallerAuthException');
  });

  it('keeps the provider details (status, Retry-After) the lifecycle classifies failures by', () => {
    const err = new ProviderException(ProviderErrorCode.RateLimited, 'rate limited', {
      status: 429,
      retryAfterMs: 2000,
    });
    expect(err.details).toEqual({ status: 429, retryAfterMs: 2000 });
    expect(err.transient).toBe(true);
    expect(new ProviderException(ProviderErrorCode.Timeout, 'slow').details).toEqual({});
    expect(new ProviderException(ProviderErrorCode.InvalidClient, 'no').transient).toBe(false);
  });

  it('keeps the secret reference and the transient flag', () => {
    const err = new SecretsException(SecretsErrorCode.Unavailable, 'throttled', {
      source: 'arn:aws:secretsmanager:eu-west-1:1:secret:x',
    });
    expect(err.source).toBe('arn:aws:secretsmanager:eu-west-1:1:secret:x');
    expect(err.transient).toBe(true);
    expect(
      new SecretsException(SecretsErrorCode.Malformed, 'not JSON', { source: 'f' }).transient,
    ).toBe(false);
  });

  it('lists configuration problems one per line, and keeps them', () => {
    const err = ConfigException.of(ConfigErrorCode.Invalid, ['PORT: a number', 'HOST: required']);
    expect(err.message).toBe('Invalid configuration:\n  - PORT: a number\n  - HOST: required');
    expect(err.problems).toEqual(['PORT: a number', 'HOST: required']);
    expect(err.code).toBe(ConfigErrorCode.Invalid);
    expect(new ConfigException(ConfigErrorCode.FileUnparsable, 'bad').problems).toEqual(['bad']);
  });
});
