import { Readable } from 'node:stream';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import type { ApiOutcome } from '../provider/provider-api.client';
import { ProviderErrorCode } from '../provider/provider.exception';
import { collected, type ForwardedAnswer, passed, screened } from './forwarded-answer';

const NAMES = new Map([
  ['content-type', 'content-type'],
  ['content-length', 'content-length'],
  ['etag', 'etag'],
]);
const LIMIT = { maxResponseBytes: 64 * 1024, limitSetting: 'FORWARD_MAX_RESPONSE_BYTES' };
const TEXT = Buffer.from(`{"items":"${'x'.repeat(20_000)}"}`);

function answer(body: Buffer | Readable, headers: Record<string, string>): ApiOutcome {
  return { kind: 'answered', status: 200, headers, body };
}

async function bytes(result: Awaited<ReturnType<typeof passed>>): Promise<Buffer> {
  if (result.kind !== 'answered') throw result.error;
  if (Buffer.isBuffer(result.body)) return result.body;
  const chunks: Buffer[] = [];
  for await (const c of result.body) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

describe(passed.name, () => {
  it.each([
    ['gzip', gzipSync(TEXT)],
    ['x-gzip', gzipSync(TEXT)],
    ['deflate', deflateSync(TEXT)],
    ['br', brotliCompressSync(TEXT)],
    ['gzip, br', brotliCompressSync(gzipSync(TEXT))],
    ['identity', TEXT],
  ])('relays a %s answer in identity, labelled as such', async (coding, encoded) => {
    const headers = {
      'content-type': 'application/json',
      'content-encoding': coding,
      'content-length': String(encoded.length),
    };
    for (const body of [encoded, Readable.from([encoded.subarray(0, 10), encoded.subarray(10)])]) {
      const result = await passed(answer(body, headers), NAMES, LIMIT);
      expect((await bytes(result)).equals(TEXT)).toBe(true);
      if (result.kind !== 'answered') throw result.error;
      expect(result.headers).toEqual(
        coding === 'identity'
          ? { ...headers, 'content-encoding': undefined }
          : { 'content-type': 'application/json' },
      );
    }
  });

  it('leaves a body with no coding untouched, and drops only the labels of an empty one', async () => {
    const plain = await passed(answer(TEXT, { 'content-length': '5' }), NAMES, LIMIT);
    expect(plain).toMatchObject({ body: TEXT, headers: { 'content-length': '5' } });
    const head = { 'content-encoding': 'gzip', 'content-length': '999', etag: '"a"' };
    for (const body of [Buffer.alloc(0), Readable.from([])]) {
      const result = await passed(answer(body, head), NAMES, LIMIT);
      expect((await bytes(result)).length).toBe(0);
      expect(result).toMatchObject({ headers: { etag: '"a"' } });
      expect(result.kind === 'answered' && 'content-length' in result.headers).toBe(false);
    }
  });

  it.each(['compress', 'zstd', 'gzip, gzip, gzip, gzip'])(
    'refuses a %s answer, outcome unknown, naming no provider value',
    async (coding) => {
      const stream = Readable.from([TEXT]);
      const result = await passed(answer(stream, { 'content-encoding': coding }), NAMES, LIMIT);
      expect(result).toMatchObject({
        kind: 'failed',
        delivered: 'maybe',
        error: { code: ProviderErrorCode.MalformedResponse },
      });
      expect(result.kind === 'failed' && result.error.message).toContain('cannot decode');
      expect(stream.destroyed).toBe(true);
    },
  );

  it('bounds the decoded bytes, whole and streamed, and refuses a body that is not what it says', async () => {
    const bomb = gzipSync(Buffer.alloc(LIMIT.maxResponseBytes + 1));
    for (const body of [bomb, Readable.from([bomb])]) {
      const result = await passed(answer(body, { 'content-encoding': 'gzip' }), NAMES, LIMIT);
      await expect(bytes(result)).rejects.toThrow(
        /over 65536 bytes once decoded \(FORWARD_MAX_RESPONSE_BYTES\)/,
      );
    }
    for (const body of [TEXT, Readable.from([TEXT])]) {
      const result = await passed(answer(body, { 'content-encoding': 'br' }), NAMES, LIMIT);
      await expect(bytes(result)).rejects.toThrow(/not valid br/);
    }
  });
});

describe(collected.name, () => {
  it('keeps the decoded body for replays, and refuses one too large to keep once decoded', async () => {
    const gz = gzipSync(TEXT);
    const kept = await collected(
      answer(Readable.from([gz]), { 'content-encoding': 'gzip' }),
      30_000,
      NAMES,
      LIMIT,
    );
    expect(kept.kind === 'answered' && Buffer.isBuffer(kept.body)).toBe(true);
    expect((await bytes(kept)).equals(TEXT)).toBe(true);
    const small = await collected(
      answer(Readable.from([gz]), { 'content-encoding': 'gzip' }),
      1024,
      NAMES,
      LIMIT,
    );
    expect(small).toMatchObject({ kind: 'failed', delivered: 'maybe' });
  });
});

describe(screened.name, () => {
  const TOKEN = 'Op/Tk+en-abcDEF123';
  const forwarded = (headers: Record<string, string>, body: string): ForwardedAnswer => ({
    kind: 'answered',
    status: 200,
    headers,
    body: Buffer.from(body),
  });

  it('withholds an answer whose returned headers or body spell the token, and passes a clean one', async () => {
    const hex = Buffer.from(`Bearer ${TOKEN}`).toString('hex').toUpperCase();
    const late = () => undefined;
    expect(await screened(forwarded({ etag: `"${hex}"` }, '{}'), [TOKEN], LIMIT, late)).toBe(
      'echoed',
    );
    expect(
      await screened(
        forwarded({ location: `/cb?t=${encodeURIComponent(TOKEN)}` }, '{}'),
        [TOKEN],
        LIMIT,
        late,
      ),
    ).toBe('echoed');
    expect(
      await screened(
        forwarded({}, `{"a":"${TOKEN.replaceAll('/', '\\/')}"}`),
        [TOKEN],
        LIMIT,
        late,
      ),
    ).toBe('echoed');
    const clean = forwarded({ etag: '"abc"' }, '{"ok":true}');
    expect(await screened(clean, [TOKEN], LIMIT, late)).toBe(clean);
  });
});
