import {
  classifyRedisError,
  explainRedisError,
  explainWrongCredentials,
  tlsMismatch,
} from './redis-problem';

function withCode(message: string, code: string): Error {
  return Object.assign(new Error(message), { code });
}

describe(classifyRedisError.name, () => {
  it.each([
    [
      new Error('WRONGPASS invalid username-password pair or user is disabled.'),
      'authentication',
      'REDIS_PASSWORD_FILE',
    ],
    [new Error('NOAUTH Authentication required.'), 'authentication', 'none is configured'],
    [new Error('Ready check failed: NOAUTH Authentication required.'), 'authentication', 'NOAUTH'],
    [
      new Error("NOPERM this user has no permissions to run the 'evalsha' command"),
      'permission',
      'evalsha',
    ],
    [
      withCode('unable to verify the first certificate', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE'),
      'tls',
      'REDIS_TLS_CA_FILE',
    ],
    [
      withCode('self-signed certificate', 'DEPTH_ZERO_SELF_SIGNED_CERT'),
      'tls',
      'DEPTH_ZERO_SELF_SIGNED_CERT',
    ],
    [
      withCode('self-signed certificate in certificate chain', 'SELF_SIGNED_CERT_IN_CHAIN'),
      'tls',
      'SELF_SIGNED_CERT_IN_CHAIN',
    ],
    [
      withCode("Hostname/IP does not match certificate's altnames", 'ERR_TLS_CERT_ALTNAME_INVALID'),
      'tls',
      'REDIS_TLS_SERVER_NAME',
    ],
  ])('classifies %s as a configuration error', (err, kind, named) => {
    const problem = classifyRedisError(err);
    expect(problem?.kind).toBe(kind);
    expect(problem?.message).toContain(named);
  });

  it('names REDIS_TLS and the URL scheme for a TLS handshake with a plain port', () => {
    const problem = classifyRedisError(
      withCode('wrong version number', 'ERR_SSL_WRONG_VERSION_NUMBER'),
    );
    expect(problem?.kind).toBe('tls');
    expect(problem?.message).toMatch(/REDIS_TLS/);
    expect(problem?.message).toMatch(/use a redis:\/\/ URL/);
  });

  it('classifies a dropped connection once a probe explained it, and only that one', () => {
    const explained = withCode('read ECONNRESET', 'ECONNRESET');
    explainRedisError(explained, tlsMismatch(false));
    expect(classifyRedisError(explained)).toEqual({
      kind: 'tls',
      message: expect.stringContaining('use a rediss:// URL or set REDIS_TLS=true') as string,
    });
    expect(classifyRedisError(withCode('read ECONNRESET', 'ECONNRESET'))).toBeUndefined();
  });

  it('names where the refused credentials came from once the connection explained it', () => {
    const err = new Error('WRONGPASS invalid username-password pair or user is disabled.');
    explainWrongCredentials(err, 'the user and password in REDIS_URL (redis.url)');
    expect(classifyRedisError(err)).toEqual({
      kind: 'authentication',
      message:
        'Redis refused the credentials (WRONGPASS invalid username-password pair or user is disabled.); check the user and password in REDIS_URL (redis.url)',
    });
    const other = new Error('NOAUTH Authentication required.');
    explainWrongCredentials(other, 'the user and password in REDIS_URL (redis.url)');
    expect(classifyRedisError(other)?.message).toContain('none is configured');
  });

  it('looks inside a cluster error at its last node error', () => {
    const err = Object.assign(new Error('Failed to refresh slots cache.'), {
      lastNodeError: new Error('WRONGPASS invalid username-password pair'),
    });
    expect(classifyRedisError(err)?.kind).toBe('authentication');
  });

  it.each([
    withCode('connect ECONNREFUSED 127.0.0.1:6379', 'ECONNREFUSED'),
    new Error('Command timed out'),
    new Error("Stream isn't writeable and enableOfflineQueue options is false"),
    new Error("READONLY You can't write against a read only replica."),
    'not even an error',
  ])('leaves an outage or anything else alone: %s', (err) => {
    expect(classifyRedisError(err)).toBeUndefined();
  });
});
