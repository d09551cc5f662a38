import { ProviderErrorCode, ProviderException } from './provider.exception';
import { MAX_LIFETIME_SECONDS, parseTokenResponse } from './token-response.parser';

const SENT = 1_700_000_000_000;

function parseErr(body: string): ProviderException {
  try {
    parseTokenResponse(body, SENT, 1800);
  } catch (err) {
    if (err instanceof ProviderException) return err;
    throw err;
  }
  throw new Error('expected a ProviderException');
}

describe(parseTokenResponse.name, () => {
  it('accepts the minimal body the provider plugin reads, with the default lifetime', () => {
    const t = parseTokenResponse('{"access_token":"abc.DEF-123"}', SENT, 1800);
    expect(t).toEqual({
      accessToken: 'abc.DEF-123',
      obtainedAt: SENT,
      expiresAt: SENT + 1_800_000,
      lifetimeSeconds: 1800,
    });
  });

  it.each([
    ['a number', 3600, 3600],
    ['a numeric string', '3600', 3600],
    ['a padded numeric string', ' 600 ', 600],
    ['a fraction (rounded down)', 59.9, 59],
    ['null (default lifetime)', null, 1800],
  ])('reads expires_in given as %s', (_label, value, expected) => {
    const body = JSON.stringify({ access_token: 'tok', token_type: 'Bearer', expires_in: value });
    const t = parseTokenResponse(body, SENT, 1800);
    expect(t.lifetimeSeconds).toBe(expected);
    expect(t.expiresAt).toBe(SENT + expected * 1000);
  });

  it('counts expiry from when the request was sent', () => {
    const t = parseTokenResponse('{"access_token":"tok","expires_in":10}', 5000, 1800);
    expect(t.expiresAt).toBe(15_000);
  });

  it('caps an absurd expires_in at a day', () => {
    const t = parseTokenResponse('{"access_token":"tok","expires_in":315360000}', SENT, 1800);
    expect(t.lifetimeSeconds).toBe(MAX_LIFETIME_SECONDS);
  });

  it('accepts token_type in any case', () => {
    expect(
      parseTokenResponse('{"access_token":"t","token_type":"bearer"}', SENT, 60).accessToken,
    ).toBe('t');
  });

  it.each([
    ['empty body', '', /empty/],
    ['HTML error page', '<html><body>502 Bad Gateway</body></html>', /HTML/],
    ['not JSON', 'access_token=abc', /not valid JSON/],
    ['a JSON array', '["abc"]', /not a JSON object/],
    ['JSON null', 'null', /not a JSON object/],
    ['no access_token', '{"token_type":"Bearer"}', /access_token/],
    ['empty access_token', '{"access_token":""}', /access_token/],
    ['numeric access_token', '{"access_token":42}', /access_token/],
    ['access_token with spaces', '{"access_token":"a b"}', /characters/],
    ['access_token with a newline', '{"access_token":"a\\nb"}', /characters/],
    ['huge access_token', JSON.stringify({ access_token: 'a'.repeat(9000) }), /exceeds/],
    ['token_type mac', '{"access_token":"t","token_type":"mac"}', /Bearer/],
    ['expires_in zero', '{"access_token":"t","expires_in":0}', /zero or negative/],
    ['expires_in negative', '{"access_token":"t","expires_in":-5}', /zero or negative/],
    ['expires_in text', '{"access_token":"t","expires_in":"soon"}', /numeric/],
    ['expires_in boolean', '{"access_token":"t","expires_in":true}', /numeric/],
  ])('rejects %s with a coded error that does not quote the body', (_label, body, message) => {
    const err = parseErr(body);
    expect(err.code).toBe(ProviderErrorCode.MalformedResponse);
    expect(err.message).toMatch(message);
    expect(err.transient).toBe(true);
    if (body.length > 8) expect(err.message).not.toContain(body);
  });
});
