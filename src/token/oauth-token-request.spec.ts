import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { OAuthErrorCode, OAuthException } from './oauth.exception';
import {
  describeMethods,
  JWT_BEARER_ASSERTION,
  methodsFor,
  parseOAuthTokenRequest,
} from './oauth-token-request';

const FORM = 'application/x-www-form-urlencoded';
const basic = (raw: string) => `Basic ${Buffer.from(raw).toString('base64')}`;

function refusal(fn: () => unknown): { code: string; basicChallenge: boolean; message: string } {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(OAuthException);
    const e = err as OAuthException;
    return { code: e.code, basicChallenge: e.basicChallenge, message: e.message };
  }
  throw new Error('expected a refusal');
}

describe('parseOAuthTokenRequest', () => {
  it('refuses a request with several Authorization headers (invalid_request), naming the problem', () => {
    const r = refusal(() =>
      parseOAuthTokenRequest(
        FORM,
        'grant_type=client_credentials',
        REPEATED_AUTHORIZATION,
        'api-key',
      ),
    );
    expect(r.code).toBe(OAuthErrorCode.InvalidRequest);
    expect(r.message).toMatch(/one Authorization header/);
  });

  it('decodes client_secret_basic per RFC 6749 §2.3.1 (form-urlencoded id and secret)', () => {
    const r = parseOAuthTokenRequest(
      `${FORM}; charset=UTF-8`,
      'grant_type=client_credentials',
      basic('check+out%3Ax:s%2Bcr%3At'),
      'api-key',
    );
    expect(r).toEqual({
      method: 'client_secret_basic',
      authorization: 'Bearer s+cr:t',
      clientId: 'check out:x',
      target: undefined,
    });
  });

  it('reads client_secret_post and the target: resource, else audience, else scope', () => {
    const r = parseOAuthTokenRequest(
      FORM,
      'grant_type=client_credentials&client_id=ops&client_secret=k&scope=%20acme-prod%20',
      undefined,
      'api-key',
    );
    expect(r).toMatchObject({
      method: 'client_secret_post',
      authorization: 'Bearer k',
      clientId: 'ops',
      target: { param: 'scope', value: 'acme-prod' },
    });
    const both = parseOAuthTokenRequest(
      FORM,
      'grant_type=client_credentials&audience=a&resource=a',
      undefined,
      'none',
    );
    expect(both.target).toEqual({ param: 'resource', value: 'a' });
  });

  it('reads an RFC 7523 client assertion in kubernetes mode', () => {
    const r = parseOAuthTokenRequest(
      FORM,
      `grant_type=client_credentials&client_assertion_type=${encodeURIComponent(JWT_BEARER_ASSERTION)}&client_assertion=a.b.c`,
      undefined,
      'kubernetes',
    );
    expect(r).toMatchObject({ method: 'client_assertion', authorization: 'Bearer a.b.c' });
  });

  it.each([
    ['a JSON body', 'application/json', '{}', undefined, OAuthErrorCode.InvalidRequest],
    ['no media type', undefined, 'grant_type=client_credentials', undefined, 'invalid_request'],
    ['form-ish prefix', `${FORM}x`, 'grant_type=client_credentials', undefined, 'invalid_request'],
    ['no grant type', FORM, 'resource=a', undefined, 'invalid_request'],
    ['an empty grant type', FORM, 'grant_type=', undefined, 'invalid_request'],
    ['another grant type', FORM, 'grant_type=password', undefined, 'unsupported_grant_type'],
    [
      'a repeated parameter',
      FORM,
      'grant_type=client_credentials&scope=a&scope=b',
      undefined,
      'invalid_request',
    ],
    [
      'two targets that disagree',
      FORM,
      'grant_type=client_credentials&resource=a&audience=b',
      undefined,
      'invalid_request',
    ],
    ['two scopes', FORM, 'grant_type=client_credentials&scope=a+b', undefined, 'invalid_scope'],
    [
      'Basic and post together',
      FORM,
      'grant_type=client_credentials&client_id=a&client_secret=b',
      basic('a:b'),
      'invalid_request',
    ],
    [
      'a client_id that differs from Basic',
      FORM,
      'grant_type=client_credentials&client_id=x',
      basic('a:b'),
      'invalid_request',
    ],
    [
      'post without client_id',
      FORM,
      'grant_type=client_credentials&client_secret=b',
      undefined,
      'invalid_request',
    ],
    [
      'an assertion of another type',
      FORM,
      'grant_type=client_credentials&client_assertion_type=saml&client_assertion=x',
      undefined,
      'invalid_request',
    ],
    ['a Bearer header', FORM, 'grant_type=client_credentials', 'Bearer k', 'invalid_client'],
    ['Basic without a colon', FORM, 'grant_type=client_credentials', basic('ab'), 'invalid_client'],
    [
      'Basic with bad escapes',
      FORM,
      'grant_type=client_credentials',
      basic('a:%zz'),
      'invalid_client',
    ],
  ] as const)('refuses %s', (_name, contentType, body, authorization, code) => {
    expect(
      refusal(() => parseOAuthTokenRequest(contentType, body, authorization, 'api-key')).code,
    ).toBe(code);
  });

  it('challenges Basic only when Basic was tried', () => {
    expect(
      refusal(() =>
        parseOAuthTokenRequest(FORM, 'grant_type=client_credentials', basic('a'), 'api-key'),
      ),
    ).toMatchObject({ code: 'invalid_client', basicChallenge: true });
    expect(
      refusal(() =>
        parseOAuthTokenRequest(FORM, 'grant_type=client_credentials', 'Bearer x', 'api-key'),
      ),
    ).toMatchObject({ code: 'invalid_client', basicChallenge: false });
  });

  it('accepts only the methods of the configured mode', () => {
    const assertion = `grant_type=client_credentials&client_assertion_type=${encodeURIComponent(JWT_BEARER_ASSERTION)}&client_assertion=a.b.c`;
    expect(refusal(() => parseOAuthTokenRequest(FORM, assertion, undefined, 'api-key')).code).toBe(
      'invalid_client',
    );
    expect(
      refusal(() =>
        parseOAuthTokenRequest(FORM, 'grant_type=client_credentials', basic('a:b'), 'kubernetes'),
      ).code,
    ).toBe('invalid_client');
    expect(
      refusal(() =>
        parseOAuthTokenRequest(
          FORM,
          'grant_type=client_credentials&client_id=a&client_secret=b',
          undefined,
          'kubernetes',
        ),
      ).code,
    ).toBe('invalid_client');
    expect(methodsFor('api-key')).toEqual(['client_secret_basic', 'client_secret_post']);
    // A service-account token is a reusable bearer credential, not a private_key_jwt assertion.
    expect(methodsFor('kubernetes')).toEqual([]);
    expect(describeMethods('kubernetes')).toContain('service-account token as client_assertion');
  });

  it('never quotes a submitted secret in its messages', () => {
    const secret = 'S3cr3t-value-never-echoed';
    for (const [body, auth] of [
      [`grant_type=client_credentials&client_secret=${secret}`, undefined],
      [`grant_type=password&client_secret=${secret}`, undefined],
      [`grant_type=client_credentials&client_id=a&client_secret=${secret}`, basic(`a:${secret}`)],
      ['grant_type=client_credentials', basic(`${secret}`)],
    ] as const) {
      expect(
        refusal(() => parseOAuthTokenRequest(FORM, body, auth, 'api-key')).message,
      ).not.toContain(secret);
    }
  });

  it('refuses an empty client secret in the Basic header (invalid_client, Basic challenge)', () => {
    for (const raw of ['checkout:', 'checkout', ':']) {
      const r = refusal(() =>
        parseOAuthTokenRequest(FORM, 'grant_type=client_credentials', basic(raw), 'api-key'),
      );
      expect([raw, r.code, r.basicChallenge]).toEqual([raw, 'invalid_client', true]);
    }
    expect(
      refusal(() =>
        parseOAuthTokenRequest(
          FORM,
          'grant_type=client_credentials',
          basic('checkout:'),
          'api-key',
        ),
      ).message,
    ).toBe(
      'the client secret in the Authorization header is empty; send the API key as the secret',
    );
  });
});
