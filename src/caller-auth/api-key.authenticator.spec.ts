import { createHash, randomBytes } from 'node:crypto';
import type { ApiKeyGrant } from '../config/caller-auth.schema';
import { ConfigException } from '../config/config.exception';
import { ApiKeyAuthenticator } from './api-key.authenticator';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';

const newKey = () => randomBytes(32).toString('base64url');
const sha256 = (key: string) => createHash('sha256').update(key).digest('hex');

function refusal(fn: () => unknown): CallerAuthException {
  try {
    fn();
  } catch (err) {
    if (err instanceof CallerAuthException) return err;
    throw err;
  }
  throw new Error('expected a CallerAuthException');
}

describe(ApiKeyAuthenticator.name, () => {
  const checkoutKey = newKey();
  const opsKey = newKey();
  const grants: ApiKeyGrant[] = [
    {
      name: 'checkout',
      sha256: sha256(checkoutKey),
      clients: ['acme-prod', 'acme-preprod'],
      scopes: ['token', 'forward'],
    },
    { name: 'ops', sha256: sha256(opsKey), clients: ['*'], scopes: ['forward', 'admin'] },
  ];

  it('authenticates a known key synchronously, as the caller it was granted to', () => {
    const auth = new ApiKeyAuthenticator(grants);
    const caller = auth.authenticate(`Bearer ${checkoutKey}`);
    expect(caller).toEqual({
      name: 'checkout',
      clients: new Set(['acme-prod', 'acme-preprod']),
      scopes: new Set(['token', 'forward']),
    });
    expect(auth.authenticate(`bearer   ${opsKey}  `)).toEqual({
      name: 'ops',
      clients: '*',
      scopes: new Set(['forward', 'admin']),
    });
  });

  it("compares whole digests: a stored hash sharing the first bytes of a key's hash matches nothing else", () => {
    const real = sha256(checkoutKey);
    // Same first 6 bytes (the index), different last byte: the hash of some other key.
    const lookalike = real.slice(0, 62) + (real.endsWith('00') ? '01' : '00');
    const auth = new ApiKeyAuthenticator([
      { name: 'lookalike', sha256: lookalike, clients: ['*'], scopes: ['token'] },
      { name: 'checkout', sha256: real, clients: ['acme-prod'], scopes: ['token'] },
    ]);
    expect(auth.authenticate(`Bearer ${checkoutKey}`).name).toBe('checkout');
    const alone = new ApiKeyAuthenticator([
      { name: 'lookalike', sha256: lookalike, clients: ['*'], scopes: ['token'] },
    ]);
    expect(refusal(() => alone.authenticate(`Bearer ${checkoutKey}`)).code).toBe(
      CallerAuthErrorCode.Unauthenticated,
    );
  });

  it.each([
    ['a missing header', undefined],
    ['an empty header', ''],
    ['another scheme', `Basic ${Buffer.from(`x:${checkoutKey}`).toString('base64')}`],
    ['the bare key', checkoutKey],
    ['"Bearer" alone', 'Bearer'],
    ['"Bearer " and nothing', 'Bearer '],
    ['an unknown key', `Bearer ${newKey()}`],
    [
      'the key with a character changed',
      `Bearer ${checkoutKey.slice(0, -1)}${checkoutKey.endsWith('A') ? 'B' : 'A'}`,
    ],
    ['the key prefixed', `Bearer x${checkoutKey}`],
    ['the key hash instead of the key', `Bearer ${sha256(checkoutKey)}`],
    ['two credentials', `Bearer ${checkoutKey} ${opsKey}`],
    ['a comma-joined duplicate header', `Bearer ${checkoutKey}, Bearer ${opsKey}`],
    ['non-token characters', 'Bearer k€y"<script>'],
    ['control characters', 'Bearer abc\u0000def'],
    ['an oversized credential', `Bearer ${'a'.repeat(100_000)}`],
  ])('refuses %s with 401', (_label, header) => {
    const err = refusal(() => new ApiKeyAuthenticator(grants).authenticate(header));
    expect(err.code).toBe(CallerAuthErrorCode.Unauthenticated);
    expect(err.message).toMatch(/Bearer|API key/);
    // The detail never echoes what was sent.
    const sent = header?.slice(7, 30) ?? '';
    if (sent.length > 4) expect(err.message).not.toContain(sent);
  });

  it('swaps its keys atomically on replace, reporting who was added and removed', () => {
    const auth = new ApiKeyAuthenticator(grants);
    const billingKey = newKey();
    const change = auth.replace([
      grants[0],
      { name: 'billing', sha256: sha256(billingKey), clients: ['acme-prod'], scopes: ['token'] },
    ]);
    expect(change).toEqual({ added: ['billing'], removed: ['ops'] });
    expect(auth.authenticate(`Bearer ${billingKey}`).name).toBe('billing');
    expect(refusal(() => auth.authenticate(`Bearer ${opsKey}`)).code).toBe(
      CallerAuthErrorCode.Unauthenticated,
    );
  });

  it('refuses a key listed twice, keeping the keys it had', () => {
    const auth = new ApiKeyAuthenticator(grants);
    expect(() => auth.replace([grants[0], { ...grants[0], name: 'again' }])).toThrow(
      ConfigException,
    );
    expect(auth.authenticate(`Bearer ${opsKey}`).name).toBe('ops');
  });

  it('reloads on a timer; a failed reload keeps the current keys', async () => {
    jest.useFakeTimers();
    try {
      let next: Promise<ApiKeyGrant[]> = Promise.resolve([grants[1]]);
      const auth = new ApiKeyAuthenticator(grants, () => next);
      const reports: unknown[] = [];
      auth.reloadEvery(1000, (r) => reports.push(r));
      await jest.advanceTimersByTimeAsync(1000);
      expect(reports).toEqual([{ changed: { added: [], removed: ['checkout'] } }]);
      next = Promise.reject(new Error('secret unavailable'));
      next.catch(() => undefined);
      await jest.advanceTimersByTimeAsync(1000);
      expect(reports).toHaveLength(2);
      expect(auth.authenticate(`Bearer ${opsKey}`).name).toBe('ops');
      auth.close();
      await jest.advanceTimersByTimeAsync(5000);
      expect(reports).toHaveLength(2);
    } finally {
      jest.useRealTimers();
    }
  });

  it('reloads now from its source on demand (the admin reload), naming who changed', async () => {
    // No source: inline keys only, nothing to re-read.
    await expect(new ApiKeyAuthenticator(grants).reloadNow()).resolves.toEqual({
      added: [],
      removed: [],
    });
    const newcomer = newKey();
    let source = async (): Promise<ApiKeyGrant[]> => [
      grants[1],
      { name: 'newcomer', sha256: sha256(newcomer), clients: ['*'], scopes: ['token'] },
    ];
    const auth = new ApiKeyAuthenticator(grants, () => source());
    await expect(auth.reloadNow()).resolves.toEqual({ added: ['newcomer'], removed: ['checkout'] });
    expect(auth.authenticate(`Bearer ${newcomer}`).name).toBe('newcomer');
    expect(() => auth.authenticate(`Bearer ${checkoutKey}`)).toThrow(CallerAuthException);
    // A failed read keeps the keys and says so to the caller of reloadNow.
    source = () => Promise.reject(new Error('unreadable'));
    await expect(auth.reloadNow()).rejects.toThrow('unreadable');
    expect(auth.authenticate(`Bearer ${newcomer}`).name).toBe('newcomer');
  });
});
