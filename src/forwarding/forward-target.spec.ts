import { DEFAULT_FORWARD_RULES, forwardRuleSchema } from '../config/client.schema';
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
});

describe(allowedBy.name, () => {
  it('lets a method under a prefix pass, and names the rules otherwise', () => {
    expect(allowedBy('acme', DEFAULT_FORWARD_RULES, 'GET', '/api/marketing/v1/offers').prefix).toBe(
      '/api/marketing/v1/',
    );
    expect(() =>
      allowedBy('acme', DEFAULT_FORWARD_RULES, 'GET', '/api/marketing/v1-admin/x'),
    ).toThrow(/under \/api\/checkout\/v1\/; .* under \/api\/marketing\/v1\//);
    const getOnly = [{ methods: ['GET' as const], prefix: '/api/marketing/v1/' }];
    expect(() => allowedBy('acme', getOnly, 'POST', '/api/marketing/v1/offers')).toThrow(
      expect.objectContaining({ code: ForwardErrorCode.NotAllowed }),
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
});
