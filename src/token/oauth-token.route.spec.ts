import { issuerFor } from './oauth-token.route';

describe(issuerFor.name, () => {
  const http = { host: '0.0.0.0', port: 8080 };

  it('names the configured issuer whatever Host the request carries', () => {
    expect(
      issuerFor(
        { ...http, issuer: 'https://token-broker.shop.svc' },
        {
          protocol: 'http',
          host: 'evil.example',
        },
      ),
    ).toBe('https://token-broker.shop.svc');
  });

  it('defaults to the origin the caller used, or the listener for a Host unfit to echo', () => {
    expect(issuerFor(http, { protocol: 'http', host: 'token-broker:8080' })).toBe(
      'http://token-broker:8080',
    );
    expect(issuerFor(http, { protocol: 'http', host: 'a b/c' })).toBe('http://0.0.0.0:8080');
  });
});
