import { EmulatorOptionsError, parseEmulatorOptions } from './main';

describe(parseEmulatorOptions.name, () => {
  it('has defaults a broker can use at once', () => {
    const o = parseEmulatorOptions([], {});
    expect(o).toMatchObject({
      port: 9090,
      host: '127.0.0.1',
      credentials: { 'emulator-merchant': 'emulator-only-secret' },
    });
    expect(o.knobs).toMatchObject({ tokenLifetimeSeconds: 1800, tokenFailure: null });
  });

  it('reads the environment, and flags win over it', () => {
    const env = {
      EMULATOR_PORT: '7000',
      EMULATOR_CLIENTS: 'a:1,b:2',
      EMULATOR_TOKEN_LIFETIME_SECONDS: '60',
      EMULATOR_TOKEN_FAILURE: 'status:503:7',
    };
    const o = parseEmulatorOptions(
      ['--port=7001', '--token-lifetime', '1', '--token-type', 'none'],
      env,
    );
    expect(o.port).toBe(7001);
    expect(o.credentials).toEqual({ a: '1', b: '2' });
    expect(o.knobs).toMatchObject({
      tokenLifetimeSeconds: 1,
      tokenType: null,
      tokenFailure: { kind: 'status', status: 503, retryAfter: '7' },
    });
    const flags = parseEmulatorOptions(
      ['--client', 'x:y', '--client=z:w:with-colon', '--orders-failure', 'timeout-after-create'],
      env,
    );
    expect(flags.credentials).toEqual({ x: 'y', z: 'w:with-colon' });
    expect(flags.knobs.ordersFailure).toEqual({ kind: 'timeout-after-create' });
  });

  it.each([
    [['--prot', '1'], /unknown argument "--prot"/],
    [['--port'], /--port needs a value/],
    [['--port', 'http'], /--port must be a whole number from 0 to 65535/],
    [['--expires-in', 'sometimes'], /--expires-in must be number, string or omit/],
    [['--token-failure', 'status:200'], /status:<code> needs a 4xx or 5xx code/],
    [['--token-failure', 'flaky'], /--token-failure must be/],
    [['--client', 'no-secret'], /client credentials must be id:secret/],
  ])('refuses %j naming the option', (argv, message) => {
    expect(() => parseEmulatorOptions(argv, {})).toThrow(EmulatorOptionsError);
    expect(() => parseEmulatorOptions(argv, {})).toThrow(message);
  });
});
