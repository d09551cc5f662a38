import type { IncomingMessage, ServerResponse } from 'node:http';
import type { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { REPEATED_AUTHORIZATION } from '../caller-auth/bearer-credential';
import { type TokenAnswer, TokenFront, type TokenQuery } from './token-front';
import type { RequestIds } from '../http/request-id';
import type { CallerAuthenticator } from '../caller-auth/caller';
import type { TokenAuditTrail } from './token-audit';
import type { TokenService } from './token.service';
import { toRecord } from './token-record';

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

describe(`${TokenFront.name}: answers from a held token`, () => {
  const t0 = Date.parse('2026-11-23T00:00:00.000Z');
  // 1000.5 s left at t0: expires_in drops from four digits to three half a second later.
  const record = toRecord({ accessToken: 'tok-A', obtainedAt: t0, expiresAt: t0 + 1_000_500 });
  const caller = { name: 'svc', clients: '*', scopes: new Set(['token']) } as const;
  let front: TokenFront;

  beforeEach(() => {
    const tokens = {
      resolveClient: () => 'acme',
      clientConfig: () => ({ id: 'acme' }),
      peek: () => record,
      maxMinTtlSeconds: 300,
    } as unknown as TokenService;
    const auth = { authenticate: () => caller } as unknown as CallerAuthenticator;
    const audit = { issued: () => undefined } as unknown as TokenAuditTrail;
    const metrics = { requests: { record: () => undefined } } as unknown as HttpMetricsHook;
    const unused = {} as never;
    front = new TokenFront(tokens, auth, unused, audit, metrics, unused, unused);
  });

  afterEach(() => jest.restoreAllMocks());

  function served(at: number) {
    jest.spyOn(Date, 'now').mockReturnValue(at);
    const { res, written } = response();
    front.tryServe(request('/token?client=acme'), res);
    const headers = written.headers ?? [];
    const length = headers[headers.indexOf('content-length') + 1];
    return { written, length, body: JSON.parse(String(written.body)) as { expires_in: number } };
  }

  it('shares one body within a second, and its Content-Length follows the body across seconds', () => {
    const a = served(t0 + 100);
    const b = served(t0 + 400);
    expect(b.written.body).toBe(a.written.body);
    expect(a.body.expires_in).toBe(1000);
    const c = served(t0 + 600);
    expect(c.body.expires_in).toBe(999);
    expect(c.written.body).not.toBe(a.written.body);
    for (const s of [a, c]) expect(s.length).toBe(String(s.written.body?.length));
    expect(Number(c.length)).toBe(Number(a.length) - 1);
    // A later second of the same length: a new body, the same headers.
    const d = served(t0 + 1_600);
    expect(d.body.expires_in).toBe(998);
    expect(d.length).toBe(c.length);
    expect(d.written.headers?.slice(0, -1)).toEqual(c.written.headers?.slice(0, -1));
  });
});
