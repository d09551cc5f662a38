import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import {
  assertJsonObject,
  bodyFingerprint,
  idempotencyKeyHash,
  isJsonContentType,
  readOrderHeaders,
} from './order-request';
import { OrdersErrorCode, ForwardingException } from './forwarding.exception';

const REQ_ID = 'req-123';
const TRACEPARENT = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

/** Node's view of a request: lowercased `headers` plus `rawHeaders` as sent. */
function incoming(pairs: Array<[string, string]>): [IncomingHttpHeaders, string[]] {
  const headers: IncomingHttpHeaders = {};
  const raw: string[] = [];
  for (const [name, value] of pairs) {
    raw.push(name, value);
    const key = name.toLowerCase();
    const prev = headers[key];
    headers[key] = prev === undefined ? value : `${String(prev)}, ${value}`;
  }
  return [headers, raw];
}

function forwarded(pairs: Array<[string, string]>): Record<string, string> {
  const [headers, raw] = incoming(pairs);
  return { ...readOrderHeaders(headers, raw, REQ_ID).forward };
}

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof ForwardingException) return err.code;
    throw err;
  }
  return undefined;
}

describe(readOrderHeaders.name, () => {
  it('forwards the idempotency key, the request id and trace context, and nothing else', () => {
    expect(
      forwarded([
        ['Idempotency-Key', 'order-42'],
        ['X-Request-Id', 'caller-chosen'],
        ['traceparent', TRACEPARENT],
        ['tracestate', 'vendor=abc'],
        ['Authorization', 'Bearer caller-credential'],
        ['Cookie', 'session=secret'],
        ['Host', 'broker.internal'],
        ['Content-Type', 'application/json'],
        ['Content-Length', '12'],
        ['X-Forwarded-For', '10.0.0.1'],
        ['X-Api-Key', 'another-secret'],
        ['Accept-Encoding', 'gzip'],
        ['Connection', 'keep-alive'],
        ['Keep-Alive', 'timeout=5'],
        ['Proxy-Authorization', 'Basic eA=='],
        ['TE', 'trailers'],
        ['Trailer', 'x-checksum'],
        ['Transfer-Encoding', 'chunked'],
        ['Upgrade', 'websocket'],
      ]),
    ).toEqual({
      'idempotency-key': 'order-42',
      'x-request-id': REQ_ID,
      traceparent: TRACEPARENT,
      tracestate: 'vendor=abc',
    });
  });

  it('always sends the broker request id, even when the caller sent none', () => {
    expect(forwarded([])).toEqual({ 'x-request-id': REQ_ID });
  });

  it('drops a header that the Connection header nominates as hop-by-hop', () => {
    const headers = forwarded([
      ['Connection', 'keep-alive, traceparent'],
      ['traceparent', TRACEPARENT],
      ['Idempotency-Key', 'k'],
    ]);
    expect(headers).toEqual({ 'idempotency-key': 'k', 'x-request-id': REQ_ID });
  });

  it('still reads a nominated Idempotency-Key for its own deduplication', () => {
    const [headers, raw] = incoming([
      ['Connection', 'idempotency-key'],
      ['Idempotency-Key', 'k'],
    ]);
    const result = readOrderHeaders(headers, raw, REQ_ID);
    expect(result.idempotencyKey).toBe('k');
    expect(result.forward['idempotency-key']).toBeUndefined();
  });

  it.each([
    ['malformed', 'not-a-traceparent'],
    ['an all-zero trace id', '00-00000000000000000000000000000000-b7ad6b7169203331-01'],
    ['an all-zero parent id', '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01'],
    ['version ff', 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'],
  ])('drops a traceparent that is %s, with its tracestate', (_label, value) => {
    expect(
      forwarded([
        ['traceparent', value],
        ['tracestate', 'vendor=abc'],
      ]),
    ).toEqual({ 'x-request-id': REQ_ID });
  });

  it('drops a repeated traceparent (joined by Node, it no longer parses)', () => {
    expect(
      forwarded([
        ['traceparent', TRACEPARENT],
        ['traceparent', TRACEPARENT],
      ]),
    ).toEqual({ 'x-request-id': REQ_ID });
  });

  it('normalises traceparent to lowercase', () => {
    expect(forwarded([['traceparent', TRACEPARENT.toUpperCase()]]).traceparent).toBe(TRACEPARENT);
  });

  it.each([
    ['a UUID', '8e03978e-40d5-43e8-bc93-6894a57f9324'],
    ['one character', 'x'],
    ['255 characters', 'k'.repeat(255)],
    ['inner spaces and a comma', 'order 42, retry'],
    ['a quoted structured-field string', '"8e03978e-40d5"'],
  ])('accepts an Idempotency-Key that is %s, unchanged', (_label, key) => {
    const [headers, raw] = incoming([['Idempotency-Key', key]]);
    const result = readOrderHeaders(headers, raw, REQ_ID);
    expect(result.idempotencyKey).toBe(key);
    expect(result.forward['idempotency-key']).toBe(key);
  });

  it.each([
    ['empty', ''],
    ['256 characters long', 'k'.repeat(256)],
    ['non-ASCII', 'clé'],
    ['padded with spaces', ' key '],
    ['a control character', 'a\tb'],
  ])('refuses an Idempotency-Key that is %s with 400', (_label, key) => {
    const [headers, raw] = incoming([['Idempotency-Key', key]]);
    expect(codeOf(() => readOrderHeaders(headers, raw, REQ_ID))).toBe(
      OrdersErrorCode.InvalidIdempotencyKey,
    );
  });

  it('refuses a repeated Idempotency-Key rather than guess which one counts', () => {
    const [headers, raw] = incoming([
      ['Idempotency-Key', 'a'],
      ['idempotency-key', 'b'],
    ]);
    expect(headers['idempotency-key']).toBe('a, b');
    expect(codeOf(() => readOrderHeaders(headers, raw, REQ_ID))).toBe(
      OrdersErrorCode.InvalidIdempotencyKey,
    );
  });
});

describe(isJsonContentType.name, () => {
  it.each([
    ['application/json', true],
    ['Application/JSON', true],
    ['application/json; charset=utf-8', true],
    ['application/json;charset="UTF-8"', true],
    ['application/json; charset=utf8', true],
    ['application/json; profile=x', true],
    ['application/json; charset=iso-8859-1', false],
    ['application/jsonp', false],
    ['text/json', false],
    ['text/plain', false],
    ['application/x-www-form-urlencoded', false],
    ['', false],
    [undefined, false],
  ])('%s -> %s', (header, expected) => {
    expect(isJsonContentType(header)).toBe(expected);
  });
});

describe(assertJsonObject.name, () => {
  it('returns the very bytes it checked: nothing is re-serialised', () => {
    const body = Buffer.from('{ "b" : "\\u00e9",\n  "a": 1.50 }');
    expect(assertJsonObject(body)).toBe(body);
  });

  it.each([
    ['absent', undefined],
    ['empty', Buffer.alloc(0)],
    ['not JSON', Buffer.from('{"price": ')],
    ['a JSON array', Buffer.from('[{"price":1}]')],
    ['a JSON string', Buffer.from('"order"')],
    ['JSON null', Buffer.from('null')],
    ['invalid UTF-8', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d])],
  ])('refuses a body that is %s with 400', (_label, body) => {
    expect(codeOf(() => assertJsonObject(body))).toBe(OrdersErrorCode.InvalidBody);
  });
});

describe(bodyFingerprint.name, () => {
  it('is the SHA-256 of the exact bytes', () => {
    expect(bodyFingerprint(Buffer.alloc(0))).toBe(
      'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    );
    const body = Buffer.from('{"price":500}');
    expect(bodyFingerprint(body)).toBe(createHash('sha256').update(body).digest('hex'));
  });

  it('tells apart bodies that parse to the same JSON: the provider would receive other bytes', () => {
    const a = bodyFingerprint(Buffer.from('{"a":1,"b":2}'));
    expect(bodyFingerprint(Buffer.from('{"a":1,"b":2}'))).toBe(a);
    expect(bodyFingerprint(Buffer.from('{"b":2,"a":1}'))).not.toBe(a);
    expect(bodyFingerprint(Buffer.from('{"a": 1, "b": 2}'))).not.toBe(a);
  });
});

describe(idempotencyKeyHash.name, () => {
  it('is a SHA-256 hex digest that does not contain the key', () => {
    const hash = idempotencyKeyHash('order-42');
    expect(hash).toMatch(/^[0-9a-f]{64}$/);
    expect(hash).not.toContain('order-42');
    expect(idempotencyKeyHash('order-43')).not.toBe(hash);
  });
});
