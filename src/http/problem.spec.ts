import { CallerAuthErrorCode, CallerAuthException } from '../caller-auth/caller-auth.exception';
import { BrokerException, type ProblemStatus } from '../errors/broker.exception';
import { OrdersErrorCode, ForwardingException } from '../forwarding/forwarding.exception';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { SecretsErrorCode, SecretsException } from '../secrets/secrets.exception';
import { TokenErrorCode, TokenException } from '../token/token.exception';
import { toProblem } from './problem';
import { RequestErrorCode, RequestException } from './request.exception';

// @nestjs/common 12 ships ES modules only, which Jest's CommonJS runtime cannot load (see
// jest.config.js). `toProblem` needs nothing from it but `instanceof HttpException` and
// `getStatus()`, so a stand-in with exactly those replaces it here.
jest.mock('@nestjs/common', () => ({
  HttpException: class HttpException extends Error {
    constructor(
      message: string,
      private readonly status: number,
    ) {
      super(message);
    }
    getStatus(): number {
      return this.status;
    }
  },
}));

const { HttpException } = jest.requireMock<{
  HttpException: new (message: string, status: number) => Error;
}>('@nestjs/common');

describe(toProblem.name, () => {
  it('answers a caller-facing code with its status, title, message and request id', () => {
    const { problem, headers } = toProblem(
      new TokenException(TokenErrorCode.UnknownClient, 'no client "x" is configured'),
      'req-1',
    );
    expect(problem).toEqual({
      type: 'urn:token-broker:problem:unknown_client',
      title: 'Unknown client',
      status: 404,
      detail: 'no client "x" is configured',
      code: 'unknown_client',
      requestId: 'req-1',
    });
    expect(headers).toEqual({});
  });

  it('answers any exception by the status it carries, knowing nothing of its domain', () => {
    class ParcelException extends BrokerException<'parcel_gone'> {
      override get problemStatus(): ProblemStatus {
        return { status: 410, title: 'Parcel gone', retryAfterSeconds: 5 };
      }
    }
    const { problem, headers } = toProblem(new ParcelException('parcel_gone', 'it left'), 'r');
    expect(problem).toEqual({
      type: 'urn:token-broker:problem:parcel_gone',
      title: 'Parcel gone',
      status: 410,
      detail: 'it left',
      code: 'parcel_gone',
      requestId: 'r',
    });
    expect(headers).toEqual({ 'retry-after': '5' });
  });

  it('sends Retry-After from the exception, else the code default, else none', () => {
    const retry = (err: unknown) => toProblem(err).headers['retry-after'];
    expect(
      retry(new TokenException(TokenErrorCode.Unavailable, 'x', { retryAfterSeconds: 7 })),
    ).toBe('7');
    expect(retry(new TokenException(TokenErrorCode.ShuttingDown, 'x'))).toBe('1');
    expect(retry(new CallerAuthException(CallerAuthErrorCode.Unavailable, 'x'))).toBe('2');
    expect(
      retry(new ForwardingException(OrdersErrorCode.InFlight, 'x', { retryAfterSeconds: 1 })),
    ).toBe('1');
    // A 503 whose domain has no default and whose thrower gave none: no header.
    expect(retry(new ForwardingException(OrdersErrorCode.IdempotencyUnavailable, 'corrupt'))).toBe(
      undefined,
    );
    expect(retry(new CallerAuthException(CallerAuthErrorCode.Forbidden, 'x'))).toBe(undefined);
  });

  it('asks an unauthenticated caller for a bearer credential', () => {
    const { problem, headers } = toProblem(
      new CallerAuthException(CallerAuthErrorCode.Unauthenticated, 'no credential'),
    );
    expect(problem.status).toBe(401);
    expect(headers).toEqual({ 'www-authenticate': 'Bearer realm="token-broker"' });
  });

  it('maps request problems and framework errors by status', () => {
    expect(
      toProblem(new RequestException(RequestErrorCode.InvalidRequest, 'repeated')).problem.status,
    ).toBe(400);
    expect(toProblem(new HttpException('gone', 404)).problem.code).toBe(RequestErrorCode.NotFound);
  });

  it('turns internal domains (provider, secrets) and unknown errors into a 500 that echoes nothing', () => {
    for (const err of [
      new ProviderException(ProviderErrorCode.ServerError, 'provider said: secret-body', {
        status: 502,
      }),
      new SecretsException(SecretsErrorCode.AccessDenied, 'denied reading arn:secret', {
        source: 'arn:secret',
      }),
      new Error('boom secret-value'),
    ]) {
      const { problem, headers } = toProblem(err, 'req-9');
      expect(problem.status).toBe(500);
      expect(problem.code).toBe('internal_error');
      expect(problem.detail).toBe('unexpected error; quote request id req-9 when reporting it');
      expect(headers).toEqual({});
    }
  });
});
