import { defaultForwardRules, forwardRuleSchema } from '../config/client.schema';
import { ForwardErrorCode } from './forwarding.exception';
import { allowedBy, parseForwardTarget } from './forward-target';

describe(parseForwardTarget.name, () => {
  it('splits client, raw path and raw query', () => {
    expect(parseForwardTarget('/provider/acme/api/marketing/v1/offers?amount=500&x=%20')).toEqual({
      clientId: 'acme',
      path: '/api/marketing/v1/offers',
      query: '?amount=500&x=%20',
    });
  });

  it.each([
    '/provider/acme/api/../token',
    '/provider/acme/api/%2E%2e/token',
    '/provider/acme/api/%2e/token',
    '/provider/acme/api/..;/token',
    '/provider/acme/api/..;x/token',
    '/provider/acme/api/.;/token',
    '/provider/acme/api/%2e%2e;/token',
    '/provider/acme/api/%2E%2e%3b/token',
    '/provider/acme/api/.%2e%3Bx/token',
    '/provider/acme/api/..%3b/token',
    '/provider/acme/api/offers;jsessionid=1',
    '/provider/acme/api/offers%3B',
    '/provider/acme/api/a%2fb',
    '/provider/acme/api/a%5Cb',
    '/provider/acme/api/a\\b',
    '/provider/acme/api//b',
    '/provider/acme/api/%252e%252e/b',
    '/provider/acme/api/a%00',
    '/provider/acme/api/a%0d%0aX:1',
    '/provider/acme/api/a%zz',
    '/provider/acme/api/a%c3',
    '/provider/acme/api/a b',
    '/provider/acme/api/a?q=1\r\n',
    'http://evil/provider/acme/api/a',
    '/provider/acme',
    '/provider//api/a',
  ])('refuses %j with forward_path_invalid', (target) => {
    expect(() => parseForwardTarget(target)).toThrow(
      expect.objectContaining({ code: ForwardErrorCode.PathInvalid }),
    );
  });

  /** Segments one server or another reads as `..` (or a look-alike of `.` or `/`). */
  const DOT_SEGMENT_RULE = /segment of only dots and spaces/;
  const ASCII_RULE = /percent-encoded non-ASCII character/;
  it.each([
    ['..%20', DOT_SEGMENT_RULE],
    ['%20..', DOT_SEGMENT_RULE],
    ['.%20.', DOT_SEGMENT_RULE],
    ['%20', DOT_SEGMENT_RULE],
    ['...', DOT_SEGMENT_RULE],
    ['....', DOT_SEGMENT_RULE],
    ['..%2e', DOT_SEGMENT_RULE],
    ['%2e%2e%2e', DOT_SEGMENT_RULE],
    ['%2E%2E%20%20', DOT_SEGMENT_RULE],
    // Fullwidth full stop U+FF0E, twice and once.
    ['%EF%BC%8E%EF%BC%8E', ASCII_RULE],
    ['.%ef%bc%8e', ASCII_RULE],
    // Two dot leader U+2025, one dot leader U+2024, small full stop U+FE52, ellipsis U+2026.
    ['%E2%80%A5', ASCII_RULE],
    ['%E2%80%A4%E2%80%A4', ASCII_RULE],
    ['%EF%B9%92%EF%B9%92', ASCII_RULE],
    ['%E2%80%A6', ASCII_RULE],
    // Fullwidth solidus U+FF0F, division slash U+2215, fullwidth reverse solidus U+FF3C.
    ['..%EF%BC%8F..', ASCII_RULE],
    ['a%E2%88%95b', ASCII_RULE],
    ['a%EF%BC%BCb', ASCII_RULE],
    // No-break space after the dots: trimmed as a space by some servers.
    ['..%C2%A0', ASCII_RULE],
  ])('refuses the segment %j naming the rule it breaks, never echoing it', (segment, rule) => {
    const attempt = () => parseForwardTarget(`/provider/acme/api/marketing/v1/${segment}/token`);
    expect(attempt).toThrow(expect.objectContaining({ code: ForwardErrorCode.PathInvalid }));
    expect(attempt).toThrow(rule);
    expect(attempt).not.toThrow(`/${segment}/`);
  });

  it.each([
    // Overlong UTF-8 for "." and "/", and an overlong three-byte ".".
    ['%C0%AE%C0%AE', /not UTF-8/],
    ['%c0%af', /not UTF-8/],
    ['%E0%80%AE', /not UTF-8/],
    // IIS's %u escapes.
    ['%u002e%u002e', /malformed %-escape/],
    // Raw look-alikes (UTF-8 bytes as Node's parser hands them over, latin1).
    [Buffer.from('．．', 'utf8').toString('latin1'), /non-ASCII byte/],
    [Buffer.from('‥', 'utf8').toString('latin1'), /non-ASCII byte/],
    [Buffer.from('／', 'utf8').toString('latin1'), /non-ASCII byte/],
    ['..;', /";"/],
    ['..%5c', /encoded slash or backslash/],
    ['..%2F', /encoded slash or backslash/],
    ['..\\', /backslash/],
  ])('refuses %j with its own rule', (segment, rule) => {
    expect(() => parseForwardTarget(`/provider/acme/api/marketing/v1/${segment}/x`)).toThrow(rule);
  });

  it.each(['offers.json', '.well-known', 'a..b', '..a', 'v1.2', 'a%20b', 'a.', '%41%42'])(
    'lets the plain segment %j through',
    (segment) => {
      expect(parseForwardTarget(`/provider/acme/api/${segment}`).path).toBe(`/api/${segment}`);
    },
  );
});

describe(allowedBy.name, () => {
  const DEFAULT_RULES = defaultForwardRules('/api/checkout/v1/orders');

  it('lets a method under a prefix or on an exact path pass, and names the rules otherwise', () => {
    expect(allowedBy('acme', DEFAULT_RULES, 'GET', '/api/marketing/v1/offers').prefix).toBe(
      '/api/marketing/v1/',
    );
    expect(allowedBy('acme', DEFAULT_RULES, 'POST', '/api/checkout/v1/orders').path).toBe(
      '/api/checkout/v1/orders',
    );
    expect(() => allowedBy('acme', DEFAULT_RULES, 'GET', '/api/marketing/v1-admin/x')).toThrow(
      /POST on \/api\/checkout\/v1\/orders; GET, HEAD under \/api\/marketing\/v1\//,
    );
    const getOnly = [{ methods: ['GET' as const], prefix: '/api/marketing/v1/' }];
    expect(() => allowedBy('acme', getOnly, 'POST', '/api/marketing/v1/offers')).toThrow(
      expect.objectContaining({ code: ForwardErrorCode.NotAllowed }),
    );
  });

  it.each([
    ['DELETE', '/api/checkout/v1/orders/o-1'],
    ['POST', '/api/checkout/v1/orders/o-1/refunds'],
    ['POST', '/api/checkout/v1/orders/'],
    ['GET', '/api/checkout/v1/orders'],
    ['POST', '/api/marketing/v1/offers'],
  ])('refuses %s %s by default, naming the call and the setting that opens it', (method, path) => {
    const attempt = () => allowedBy('acme', DEFAULT_RULES, method, path);
    expect(attempt).toThrow(expect.objectContaining({ code: ForwardErrorCode.NotAllowed }));
    expect(attempt).toThrow(`${method} ${path} is outside the allow-list of client "acme"`);
    expect(attempt).toThrow(
      /clients\[\]\.forward\.allow, e\.g\. \{"methods":\["[A-Z]+"\],"prefix":"\/api\//,
    );
  });
});

describe('clients[].forward.allow prefixes', () => {
  it.each([
    '/api/marketing/v1',
    'api/marketing/v1/',
    '/api/../auth/',
    '/api//v1/',
    '/api/%2e%2e/',
    '/api/./v1/',
    '/api/a;b/',
  ])('refuses %j in the config', (prefix) => {
    expect(forwardRuleSchema.safeParse({ prefix }).success).toBe(false);
  });

  it('takes plain prefixes, every method by default', () => {
    expect(forwardRuleSchema.parse({ prefix: '/api/marketing/v1/' }).methods).toHaveLength(6);
    expect(forwardRuleSchema.safeParse({ prefix: '/', methods: ['GET'] }).success).toBe(true);
    expect(forwardRuleSchema.safeParse({ prefix: '/api/', methods: ['TRACE'] }).success).toBe(
      false,
    );
  });

  it('takes an exact path instead, never both or neither', () => {
    expect(forwardRuleSchema.parse({ path: '/api/checkout/v1/orders' }).path).toBe(
      '/api/checkout/v1/orders',
    );
    for (const bad of [
      {},
      { path: '/a', prefix: '/a/' },
      { path: 'a' },
      { path: '/a/../b' },
      { path: '/a/...' },
      { path: '/a;b' },
      { path: '/a%2fb' },
      { path: '/a//b' },
    ]) {
      expect(forwardRuleSchema.safeParse(bad).success).toBe(false);
    }
  });
});
