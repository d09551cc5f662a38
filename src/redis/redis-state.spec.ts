import { RedisStateTracker, type StateLogger } from './redis-state';

function tracker() {
  const lines: string[] = [];
  const log = (obj: { to?: string }) => void lines.push(String(obj.to));
  const logger = { info: log, warn: log, error: log } as unknown as StateLogger;
  return { t: new RedisStateTracker(logger, 'standalone redis://cache:6379'), lines };
}

const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
const wrongPass = new Error('WRONGPASS invalid username-password pair');
const stream = new Error("Stream isn't writeable and enableOfflineQueue options is false");
const noPerm = new Error("NOPERM this user has no permissions to run the 'eval' command");

describe(RedisStateTracker.name, () => {
  it('logs each transition once however many failures and successes repeat it', () => {
    const { t, lines } = tracker();
    for (let i = 0; i < 100; i++) t.succeeded();
    for (let i = 0; i < 100; i++) t.failed(refused, true);
    for (let i = 0; i < 100; i++) t.failed(stream);
    for (let i = 0; i < 100; i++) t.failed(wrongPass, true);
    for (let i = 0; i < 100; i++) t.failed(stream);
    for (let i = 0; i < 100; i++) t.succeeded();
    expect(lines).toEqual(['up', 'down', 'misconfigured', 'up']);
  });

  it('reports the problem only while misconfigured', () => {
    const { t } = tracker();
    t.failed(wrongPass, true);
    expect(t.state).toBe('misconfigured');
    expect(t.problem?.kind).toBe('authentication');
    t.succeeded();
    expect(t.problem).toBeUndefined();
  });

  it('leaves misconfigured for down when the server itself goes away', () => {
    const { t, lines } = tracker();
    t.failed(wrongPass, true);
    t.failed(refused, true);
    expect(lines).toEqual(['misconfigured', 'down']);
  });

  it('clears an ACL problem only on a probe success, not on a plain read', () => {
    const { t, lines } = tracker();
    t.failed(noPerm);
    expect(t.succeeded(false)).toBe(false);
    expect(t.state).toBe('misconfigured');
    expect(t.succeeded(true)).toBe(true);
    expect(lines).toEqual(['misconfigured', 'up']);
  });

  it('logs a replica started while Redis is unreachable as down once, on its first connection error', () => {
    const { t, lines } = tracker();
    // Commands failing before the connection says why are not the transition yet.
    t.failed(stream);
    expect(lines).toEqual([]);
    for (let i = 0; i < 100; i++) t.failed(refused, true);
    for (let i = 0; i < 100; i++) t.failed(stream);
    expect(lines).toEqual(['down']);
    t.succeeded();
    t.failed(refused, true);
    expect(lines).toEqual(['down', 'up', 'down']);
  });

  it('takes a host that never resolved for a setting to fix, but a later ENOTFOUND for an outage', () => {
    const notFound = Object.assign(new Error('getaddrinfo ENOTFOUND nonexistent.invalid'), {
      code: 'ENOTFOUND',
    });
    const { t, lines } = tracker();
    for (let i = 0; i < 10; i++) t.failed(notFound, true);
    expect(t.state).toBe('misconfigured');
    expect(t.problem).toEqual({
      kind: 'address',
      message:
        'the Redis host does not resolve (getaddrinfo ENOTFOUND nonexistent.invalid); check the host in REDIS_URL',
    });
    t.succeeded();
    t.failed(notFound, true);
    expect(t.state).toBe('down');
    expect(lines).toEqual(['misconfigured', 'up', 'down']);
  });
});
