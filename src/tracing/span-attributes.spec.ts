import { outgoingUrlAttributes, redisStatement } from './span-attributes';

describe(redisStatement.name, () => {
  it('keeps a script’s keys and drops its SHA and arguments', () => {
    const sealed = 'v1.sealed-token-record';
    expect(
      redisStatement('evalsha', [
        '0123abcd',
        '2',
        'tb:{acme}:token',
        'tb:{acme}:epoch',
        sealed,
        '99',
      ]),
    ).toBe('evalsha tb:{acme}:token tb:{acme}:epoch');
    expect(redisStatement('EVAL', ['return 1', 0, 'secret-arg'])).toBe('eval');
  });

  it('keeps the key of a plain command, never its value', () => {
    expect(redisStatement('set', ['tb:{acme}:lock', 'lock-value', 'PX', 5000])).toBe(
      'set tb:{acme}:lock',
    );
    expect(redisStatement('publish', ['tb:{acme}:refreshed', '{"expiresAt":1}'])).toBe(
      'publish tb:{acme}:refreshed',
    );
    expect(redisStatement('del', ['a', 'b'])).toBe('del a b');
  });

  it('names no argument of a command that takes credentials', () => {
    expect(redisStatement('auth', ['user', 'password'])).toBe('auth');
    expect(redisStatement('hello', ['3', 'AUTH', 'user', 'password'])).toBe('hello');
  });
});

describe(outgoingUrlAttributes.name, () => {
  it('drops the query string from url.full and url.query', () => {
    expect(
      outgoingUrlAttributes({ origin: 'https://api.example', path: '/v1/offers?customer=42#x' }),
    ).toEqual({ 'url.full': 'https://api.example/v1/offers', 'url.query': undefined });
  });
});
