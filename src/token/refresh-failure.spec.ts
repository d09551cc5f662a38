import { testClient } from '../../test/support/test-config';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { SecretsErrorCode, SecretsException } from '../secrets/secrets.exception';
import {
  judgeFailure,
  lifetimeProblem,
  lifetimeTooShort,
  refreshFloorHeld,
  permanentFailure,
  unavailableError,
} from './refresh-failure';
import { TokenErrorCode, TokenException } from './token.exception';

const client = testClient({ id: 'acme-preprod', credentials: { secretId: 'token-broker/acme' } });
const base = {
  client,
  attempt: 1,
  backoffBaseMs: 500,
  backoffMaxMs: 30_000,
  now: 0,
  random: () => 1,
};
const provider = (code: ProviderErrorCode, details = {}) =>
  new ProviderException(code, `provider said ${code}`, details);

describe('refresh failure', () => {
  describe(judgeFailure.name, () => {
    it('calls a 5xx transient and backs off exponentially with full jitter', () => {
      const err = provider(ProviderErrorCode.ServerError, { status: 503 });
      expect(judgeFailure(err, base)).toEqual({
        permanent: undefined,
        result: 'transient_error',
        delayMs: 500,
      });
      expect(judgeFailure(err, { ...base, attempt: 4 }).delayMs).toBe(4000);
      expect(judgeFailure(err, { ...base, attempt: 4, random: () => 0.5 }).delayMs).toBe(2000);
    });

    it("honours a 429's Retry-After", () => {
      const err = provider(ProviderErrorCode.RateLimited, { status: 429, retryAfterMs: 7000 });
      expect(judgeFailure(err, base).delayMs).toBe(7000);
    });

    it('retries faster as the token served nears expiry', () => {
      const err = provider(ProviderErrorCode.Timeout);
      // A quarter of the 8 s left caps the delay at 2 s.
      expect(judgeFailure(err, { ...base, attempt: 10, servingUntil: 8000 }).delayMs).toBe(2000);
    });

    it('calls refused credentials permanent and probes at the slowest pace', () => {
      const err = provider(ProviderErrorCode.InvalidClient, { status: 401 });
      const verdict = judgeFailure(err, { ...base, random: () => 0, servingUntil: 8000 });
      expect(verdict.result).toBe('permanent_error');
      expect(verdict.permanent?.code).toBe(TokenErrorCode.CredentialsRejected);
      expect(verdict.delayMs).toBe(30_000);
    });

    it('counts an unreadable secret as a credentials error', () => {
      const err = new SecretsException(SecretsErrorCode.AccessDenied, 'denied', { source: 's' });
      expect(judgeFailure(err, base).result).toBe('credentials_error');
    });

    it('treats an unknown error as transient', () => {
      expect(judgeFailure(new Error('boom'), base).result).toBe('transient_error');
    });
  });

  describe(permanentFailure.name, () => {
    it('names where refused credentials were read from to operators only, never their value', () => {
      const err = provider(ProviderErrorCode.InvalidClient, { status: 401 });
      const permanent = permanentFailure(err, client, 30_000);
      expect(permanent).toBeInstanceOf(TokenException);
      expect(permanent?.operatorDetail).toBe(
        'provider said provider_invalid_client; they were read from Secrets Manager secret "token-broker/acme"',
      );
      // The caller's answer: where to look, not the reference.
      expect(permanent?.message).toBe(
        "provider said provider_invalid_client; check the secret named in the broker's log or its readiness report on the admin port; quote the request id",
      );
      expect(permanent?.retryAfterSeconds).toBe(30);
      expect(permanent?.cause).toBe(err);
      const fromFile = permanentFailure(
        err,
        { ...client, credentials: { file: '/run/creds.json' } },
        30_000,
      );
      expect(fromFile?.operatorDetail).toContain('file "/run/creds.json"');
      expect(fromFile?.message).not.toContain('/run/creds.json');
      // The readiness report shows operatorDetail: a secret pasted as the secret id stays out.
      const pasted = 'q7Zp3YV0kR8mWc2LxN5tB9hJ4dF6gS1aE0uI';
      const hidden = permanentFailure(
        err,
        { ...client, credentials: { secretId: pasted } },
        30_000,
      );
      expect(hidden?.operatorDetail).toBe(
        'provider said provider_invalid_client; they were read from Secrets Manager secret "(not shown: does not look like a secret name or file path)"',
      );
      const keyFile = permanentFailure(
        err,
        { ...client, credentials: { clientId: 'acme', privateKeyFile: '/run/acme/tls.key' } },
        30_000,
      );
      expect(keyFile?.operatorDetail).toContain(
        'key file "/run/acme/tls.key" (credentials.privateKeyFile)',
      );
      // A refused certificate: both files named, never "Secrets Manager secret".
      const keyFiles = permanentFailure(
        err,
        {
          ...client,
          credentials: {
            clientId: 'acme',
            certificateFile: '/run/acme/tls.crt',
            privateKeyFile: '/run/acme/tls.key',
          },
        },
        30_000,
      );
      expect(keyFiles?.operatorDetail).toBe(
        'provider said provider_invalid_client; they were read from key files "/run/acme/tls.crt" (credentials.certificateFile) and "/run/acme/tls.key" (credentials.privateKeyFile)',
      );
    });

    it('maps another provider 4xx to unavailable and a permanent secret failure to credentials unavailable', () => {
      expect(permanentFailure(provider(ProviderErrorCode.Rejected), client, 1000)?.code).toBe(
        TokenErrorCode.Unavailable,
      );
      const missing = new SecretsException(
        SecretsErrorCode.NotFound,
        'file "/run/secrets/missing.json" does not exist',
        { source: '/run/secrets/missing.json' },
      );
      const unavailable = permanentFailure(missing, client, 1000);
      expect(unavailable).toMatchObject({
        code: TokenErrorCode.CredentialsUnavailable,
        operatorDetail:
          'cannot load the credentials for client "acme-preprod": file "/run/secrets/missing.json" does not exist',
      });
      expect(unavailable?.message).toMatch(
        /^cannot load the credentials for client "acme-preprod" \(secret_not_found\); /,
      );
      expect(unavailable?.message).not.toContain('/run/secrets');
    });

    it('returns undefined for transient failures', () => {
      expect(permanentFailure(provider(ProviderErrorCode.ServerError), client, 1000)).toBe(
        undefined,
      );
      const blip = new SecretsException(SecretsErrorCode.Unavailable, 'throttled', { source: 's' });
      expect(permanentFailure(blip, client, 1000)).toBeUndefined();
    });
  });

  describe(unavailableError.name, () => {
    it('points Retry-After at the next attempt and quotes the last error', () => {
      const err = unavailableError({
        clientId: 'acme',
        lastError: new Error('HTTP 503'),
        nextAttemptAt: 2_500,
        now: 0,
      });
      expect(err.code).toBe(TokenErrorCode.Unavailable);
      expect(err.retryAfterSeconds).toBe(3);
      expect(err.message).toBe(
        'no token with the requested remaining lifetime could be obtained in time for client "acme" (last error: HTTP 503)',
      );
      expect(unavailableError({ clientId: 'acme', now: 0 }).retryAfterSeconds).toBe(1);
      // A secret's message names its ARN: the caller hears its code, operators the message.
      const arn = 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:acme';
      const throttled = unavailableError({
        clientId: 'acme',
        lastError: new SecretsException(SecretsErrorCode.Unavailable, `${arn} throttled`, {
          source: arn,
        }),
        now: 0,
      });
      expect(throttled.message).toContain(
        '(last error: the credentials could not be read, secret_unavailable)',
      );
      expect(throttled.message).not.toContain(arn);
      expect(throttled.operatorDetail).toContain(arn);
      expect(
        unavailableError({ clientId: 'acme', nextAttemptAt: -5_000, now: 0 }).retryAfterSeconds,
      ).toBe(1);
    });
  });

  it(`${lifetimeTooShort.name} states the provider's lifetime and the min_ttl asked`, () => {
    expect(lifetimeTooShort('acme', 59_600, 120_000).message).toBe(
      `client "acme": the provider's tokens live 60 s, less than the requested min_ttl of 120 s; ask for less`,
    );
  });

  it(`${lifetimeTooShort.name} never mentions a min_ttl the caller did not send`, () => {
    const err = lifetimeTooShort('acme', 1000, 0, 4);
    expect(err.message).toBe(
      `client "acme": the provider's tokens live 1 s, too short to hand out with the minimum of 1 s left`,
    );
    expect(err.retryAfterSeconds).toBe(4);
  });

  it(`${lifetimeProblem.name} names the lifetime, what the broker needs and the setting`, () => {
    expect(lifetimeProblem('acme', 1500, 5000)).toBe(
      `client "acme": the provider's tokens live 1.5 s, less than the 6 s the broker needs to serve and refresh them (TOKEN_MIN_REFRESH_INTERVAL_MS 5 s between tokens, plus 1 s left when served)`,
    );
  });

  it(`${refreshFloorHeld.name} tells a min_ttl caller why, when to retry and what to do`, () => {
    const err = refreshFloorHeld({
      clientId: 'acme',
      requestedMs: 59_000,
      minRefreshIntervalMs: 5000,
      retryAfterMs: 3200,
    });
    expect(err.code).toBe(TokenErrorCode.Unavailable);
    expect(err.message).toBe(
      `client "acme": a token with the requested min_ttl of 59 s needs a new one, and the broker asks the provider at most once every 5 s (TOKEN_MIN_REFRESH_INTERVAL_MS); retry later or ask a smaller min_ttl`,
    );
    expect(err.retryAfterSeconds).toBe(4);
  });
});
