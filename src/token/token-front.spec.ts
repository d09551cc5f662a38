import type { IncomingMessage, ServerResponse } from 'node:http';
import type { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { type TokenAnswer, TokenFront, type TokenQuery } from './token-front';
import type { RequestIds } from '../http/request-id';

// Nest 12 ships ES modules only, which Jest's CommonJS runtime cannot load; this front only
// needs decorators and class references (injection metadata) from it and from the providers
// it is given, which do nothing outside a Nest container. Their stand-ins are built below.
jest.mock('@nestjs/common', () => ({
  Inject: () => () => undefined,
  Injectable: () => () => undefined,
}));
jest.mock('../metrics/http-metrics.hook', () => ({ HttpMetricsHook: class {} }));
jest.mock('../metrics/metrics.service', () => ({ MetricsService: class {} }));
jest.mock('./token-audit', () => ({ TokenAuditTrail: class {} }));
jest.mock('./token.service', () => ({ TokenService: class {} }));

const ANSWER: TokenAnswer = {
  status: 200,
  headers: {
    'content-type': 'application/json; charset=utf-8',
    'content-length': '20',
  },
  body: Buffer.from('{"access_token":"t"}'),
};

/** The parts of a ServerResponse the front uses, recording what it wrote. */
function response() {
  const written: { status?: number; headers?: string[]; body?: Buffer } = {};
  const res = {
    writeHead: (status: number, headers: string[]) => {
      written.status = status;
      // A copy: the front reuses its header list for the next answer.
      written.headers = [...headers];
    },
    end: (body: Buffer) => void (written.body = body),
  } as unknown as ServerResponse;
  return { res, written };
}

function request(
  url: string,
  method = 'GET',
  rawHeaders = ['Authorization', 'Bearer k'],
): IncomingMessage {
  return {
    url,
    method,
    // The front reads the raw header lines only: Node builds `headers` on first access.
    get headers(): never {
      throw new Error('req.headers read on the hot path');
    },
    rawHeaders,
  } as unknown as IncomingMessage;
}

describe(TokenFront.name, () => {
  let queries: TokenQuery[];
  let seen: Array<{ authorization?: string; ids: RequestIds }>;
  let answer: TokenAnswer | Promise<TokenAnswer>;
  let recorded: unknown[][];
  let front: TokenFront;

  beforeEach(() => {
    queries = [];
    seen = [];
    answer = ANSWER;
    recorded = [];
    const metrics = {
      requests: { record: (...args: unknown[]) => recorded.push(args) },
    } as unknown as HttpMetricsHook;
    const unused = {} as never;
    front = new TokenFront(unused, unused, unused, unused, metrics, unused, unused);
    // The answer itself is stubbed: these cases are about reading requests and writing answers.
    jest
      .spyOn(front, 'respond')
      .mockImplementation(
        (query: TokenQuery, authorization: string | undefined, ids: RequestIds) => {
          queries.push(query);
          seen.push({ authorization, ids });
          return answer;
        },
      );
  });

  it('writes the answer for a plain query and counts it', () => {
    const { res, written } = response();
    expect(front.tryServe(request('/token?client=acme&min_ttl=30'), res)).toBe(true);
    expect(queries).toEqual([{ client: 'acme', min_ttl: '30' }]);
    expect(written).toEqual({
      status: 200,
      headers: [
        'content-type',
        'application/json; charset=utf-8',
        'content-length',
        '20',
        'x-request-id',
        seen[0].ids.reqId,
      ],
      body: ANSWER.body,
    });
    expect(recorded).toEqual([['/token', 'GET', 200]]);
  });

  it("gives each request its own id when the same answer is written again, and a new answer's headers", () => {
    const first = response();
    const second = response();
    const third = response();
    front.tryServe(request('/token', 'GET', ['X-Request-Id', 'r-1']), first.res);
    front.tryServe(request('/token', 'GET', ['X-Request-Id', 'r-2']), second.res);
    answer = { ...ANSWER, status: 404, headers: { 'content-type': 'application/problem+json' } };
    front.tryServe(request('/token', 'GET', ['X-Request-Id', 'r-3']), third.res);
    expect(first.written.headers?.slice(-2)).toEqual(['x-request-id', 'r-1']);
    expect(second.written.headers?.slice(-2)).toEqual(['x-request-id', 'r-2']);
    expect(third.written).toMatchObject({
      status: 404,
      headers: ['content-type', 'application/problem+json', 'x-request-id', 'r-3'],
    });
  });

  it.each([
    [
      'the credential and request id',
      ['authorization', 'Bearer a', 'X-Request-ID', 'r-1'],
      'Bearer a',
      'r-1',
    ],
    ['no credential', ['Host', 'x'], undefined, undefined],
    [
      'a repeated Authorization as ambiguous',
      ['Authorization', 'Bearer a', 'AUTHORIZATION', 'Bearer b'],
      REPEATED_AUTHORIZATION,
      undefined,
    ],
    [
      'a repeated X-Request-Id as absent',
      ['x-request-id', 'r-1', 'x-request-id', 'r-2'],
      undefined,
      undefined,
    ],
    ['an unusable request id as absent', ['x-request-id', 'r 1'], undefined, undefined],
  ])('reads %s from the raw header lines', (_what, raw, authorization, callerRequestId) => {
    const { res, written } = response();
    front.tryServe(request('/token', 'GET', raw), res);
    expect(seen[0].authorization).toBe(authorization);
    // The broker's own id always; the caller's beside it, and echoed in the answer.
    expect(seen[0].ids.reqId).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-/);
    expect(seen[0].ids.callerRequestId).toBe(callerRequestId);
    expect(written.headers?.slice(-1)).toEqual([callerRequestId ?? seen[0].ids.reqId]);
  });

  it('writes an answer that needs I/O once it is ready', async () => {
    let resolve!: (a: TokenAnswer) => void;
    answer = new Promise((r) => (resolve = r));
    const { res, written } = response();
    expect(front.tryServe(request('/token'), res)).toBe(true);
    expect(written.status).toBeUndefined();
    resolve({ ...ANSWER, status: 503 });
    await answer;
    await Promise.resolve();
    expect(written.status).toBe(503);
    expect(recorded).toEqual([['/token', 'GET', 503]]);
  });

  it.each([
    ['an escaped value', '/token?client=ac%6De', { client: 'acme' }],
    ['an escaped key', '/token?%63lient=acme', { client: 'acme' }],
    ['a repeated parameter as a list', '/token?client=a&client=b', { client: ['a', 'b'] }],
    ['an unknown parameter', '/token?scope=x', { scope: 'x' }],
    ['a + as a space', '/token?client=a+b', { client: 'a b' }],
    ['an empty query', '/token?', {}],
  ])('decodes %s as URLSearchParams does', (_what, url, query) => {
    const { res } = response();
    expect(front.tryServe(request(url), res)).toBe(true);
    expect(queries).toEqual([query]);
  });

  it('answers HEAD as GET (Node leaves the body out)', () => {
    const { res, written } = response();
    expect(front.tryServe(request('/token?client=acme', 'HEAD'), res)).toBe(true);
    expect(written.status).toBe(200);
  });

  it.each([
    ['another method', '/token', 'POST'],
    ['another path', '/tokens', 'GET'],
    ['a sub-path', '/token/x', 'GET'],
    ['an escaped path', '/%74oken', 'GET'],
    ['an absolute-form target', 'http://x/token', 'GET'],
    ['a dot segment', '/x/../token', 'GET'],
    ['a trailing slash', '/token/', 'GET'],
    ['a repeated slash', '//token', 'GET'],
    ['a ;parameter', '/token;x', 'GET'],
    ['a #fragment on the path', '/token#x?client=acme', 'GET'],
  ])('leaves %s to the router', (_what, url, method) => {
    const { res, written } = response();
    expect(front.tryServe(request(url, method), res)).toBe(false);
    expect(queries).toEqual([]);
    expect(written).toEqual({});
  });
});
