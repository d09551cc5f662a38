import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { deflateSync, gzipSync } from 'node:zlib';
import {
  echoesToken,
  echoNeedles,
  type ScreenOptions,
  screenBody,
  screenStream,
  TokenEchoScanner,
} from './token-echo.screen';

/** Every character a bearer token may hold (RFC 6750 `b64token`), in both cases. */
const TOKEN = 'eyJhbGciOiJSUzI1NiJ9.Op/Tk+en-_x~abcDEF123==';
const HEADER = `Bearer ${TOKEN}`;
const NEEDLES = echoNeedles([TOKEN]);
const OPTIONS: ScreenOptions = {
  maxExpandedBytes: 1 << 20,
  tooLarge: () => new Error('expands too far'),
};

const each = (text: string, encode: (char: string) => string) => [...text].map(encode).join('');
const hex = (char: string, digits: number) => char.charCodeAt(0).toString(16).padStart(digits, '0');

/** The spellings providers echo a header in. */
const ENCODINGS: Record<string, (text: string) => string> = {
  verbatim: (t) => t,
  'upper case': (t) => t.toUpperCase(),
  'lower case': (t) => t.toLowerCase(),
  base64: (t) => Buffer.from(t).toString('base64'),
  'base64, one byte in': (t) => Buffer.from(`x${t}`).toString('base64'),
  'base64, two bytes in': (t) => Buffer.from(`xy${t}`).toString('base64'),
  base64url: (t) => Buffer.from(t).toString('base64url'),
  'base64url, one byte in': (t) => Buffer.from(`x${t}`).toString('base64url'),
  'base64url, two bytes in': (t) => Buffer.from(`xy${t}`).toString('base64url'),
  'hex, lower case': (t) => Buffer.from(t).toString('hex'),
  'hex, upper case': (t) => Buffer.from(t).toString('hex').toUpperCase(),
  encodeURIComponent: (t) => encodeURIComponent(t),
  'encodeURIComponent, lower-case digits': (t) =>
    encodeURIComponent(t).replace(/%[0-9A-F]{2}/g, (e) => e.toLowerCase()),
  'escape()': (t) => escape(t),
  'every character percent-encoded': (t) => each(t, (c) => `%${hex(c, 2)}`),
  "escape()'s %u form": (t) => each(t, (c) => `%u${hex(c, 4).toUpperCase()}`),
  'JSON \\/ (PHP)': (t) => t.replaceAll('/', '\\/'),
  'JSON \\u, upper-case digits': (t) => each(t, (c) => `\\u${hex(c, 4).toUpperCase()}`),
  'JSON \\u, lower-case digits': (t) => each(t, (c) => `\\u${hex(c, 4)}`),
  'JavaScript \\x': (t) => each(t, (c) => `\\x${hex(c, 2)}`),
  'HTML &#x2F;': (t) => each(t, (c) => `&#x${hex(c, 2).toUpperCase()};`),
  'HTML &#47;': (t) => each(t, (c) => `&#${c.charCodeAt(0)};`),
  'HTML &#047; (zero-padded)': (t) =>
    each(t, (c) => `&#${String(c.charCodeAt(0)).padStart(3, '0')};`),
  'HTML &#47 (no semicolon)': (t) => each(t, (c) => `&#${c.charCodeAt(0)}`),
  'HTML named (&sol; &plus; &period; &lowbar; &equals;)': (t) =>
    t
      .replaceAll('/', '&sol;')
      .replaceAll('+', '&plus;')
      .replaceAll('.', '&period;')
      .replaceAll('_', '&lowbar;')
      .replaceAll('=', '&equals;'),
  'HTML &UnderBar; and &#x2f; mixed': (t) =>
    t.replaceAll('_', '&UnderBar;').replaceAll('/', '&#x2f;').replaceAll('+', '&#43;'),
};

describe(TokenEchoScanner.name, () => {
  describe.each(Object.entries(ENCODINGS))('%s', (_name, encode) => {
    const answers = [TOKEN, HEADER].map((echo) =>
      Buffer.from(`{"headers":{"authorization":"${encode(echo)}"},"ok":true}`),
    );

    it('finds the token and the header, whole', () => {
      expect(answers.map((a) => echoesToken(a, NEEDLES))).toEqual([true, true]);
    });

    it('finds them split at every position, and one byte at a time', () => {
      for (const answer of answers) {
        const missed: number[] = [];
        for (let cut = 1; cut < answer.length; cut++) {
          const scanner = new TokenEchoScanner(NEEDLES);
          const halves = [answer.subarray(0, cut), answer.subarray(cut)];
          if (!(halves.some((c) => scanner.push(c)) || scanner.end())) missed.push(cut);
        }
        expect(missed).toEqual([]);
        const bytewise = new TokenEchoScanner(NEEDLES);
        expect([...answer].some((b) => bytewise.push(Buffer.from([b]))) || bytewise.end()).toBe(
          true,
        );
      }
    });

    it('finds nothing when the token lacks its last three characters', () => {
      const short = TOKEN.slice(0, -3);
      expect(echoesToken(Buffer.from(`{"seen":"${encode(short)}"}`), NEEDLES)).toBe(false);
    });
  });

  it('finds any of several tokens, and nothing in an answer without them', () => {
    const body = Buffer.from(`{"seen":"${HEADER}"}`);
    expect(echoesToken(body, echoNeedles(['other-token', TOKEN]))).toBe(true);
    expect(echoesToken(body, echoNeedles(['other-token']))).toBe(false);
    expect(echoesToken(body, echoNeedles(['']))).toBe(false);
    expect(echoesToken(body, echoNeedles([]))).toBe(false);
  });

  it('passes clean answers full of escapes, entities and hex', () => {
    const clean = Buffer.from(
      JSON.stringify({
        redirectUrl: 'https:\\/\\/pay.example\\/r?o=1&amp;x=%2F%2f%u002F&#47;&#x2F&sol;&nope;',
        note: 'Caf\\u00e9 \\x41 &#128512; %E2%82%AC \\\\/ 100%',
        id: randomBytes(64).toString('hex'),
        b64: randomBytes(64).toString('base64'),
      }),
    );
    expect(echoesToken(clean, echoNeedles([TOKEN, randomBytes(32).toString('base64url')]))).toBe(
      false,
    );
  });

  it('holds back enough bytes for the longest needle in its longest spelling', () => {
    const scanner = new TokenEchoScanner(NEEDLES);
    expect(scanner.heldBack).toBe(Buffer.from(TOKEN).toString('hex').length * 10 - 1);
    expect(new TokenEchoScanner(echoNeedles([])).heldBack).toBe(0);
  });
});

describe(screenBody.name, () => {
  it.each([
    ['gzip', gzipSync],
    ['zlib', deflateSync],
  ])('finds the token in %s data without a Content-Encoding', async (_kind, compress) => {
    const body = compress(Buffer.from(`{"seen":"${Buffer.from(HEADER).toString('base64')}"}`));
    expect(await screenBody(body, NEEDLES, OPTIONS)).toBe(true);
    expect(await screenBody(compress(Buffer.from('{"clean":true}')), NEEDLES, OPTIONS)).toBe(false);
  });

  it('reads a truncated gzip stream as far as it goes, and passes text that only looks compressed', async () => {
    const gz = gzipSync(Buffer.from(`{"seen":"${HEADER}"}${'x'.repeat(5000)}`));
    expect(await screenBody(gz.subarray(0, gz.length - 20), NEEDLES, OPTIONS)).toBe(true);
    // "x^" is a valid zlib header; the rest is no deflate stream.
    expect(await screenBody(Buffer.from('x^ not compressed at all'), NEEDLES, OPTIONS)).toBe(false);
    expect(await screenBody(Buffer.alloc(0), NEEDLES, OPTIONS)).toBe(false);
  });

  it('refuses compressed data that expands past the limit', async () => {
    const bomb = gzipSync(Buffer.alloc(4 << 20));
    await expect(screenBody(bomb, NEEDLES, OPTIONS)).rejects.toThrow('expands too far');
  });
});

describe(screenStream.name, () => {
  const relayed = async (body: Buffer | Readable): Promise<Buffer> => {
    if (Buffer.isBuffer(body)) return body;
    const chunks: Buffer[] = [];
    for await (const c of body) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  };

  it('decides on a short stream whole, and relays a long clean one byte for byte', async () => {
    const short = Readable.from([
      fill(10),
      Buffer.from(HEADER.slice(0, 12)),
      Buffer.from(HEADER.slice(12)),
    ]);
    expect(await screenStream(short, NEEDLES, 1024, () => undefined, OPTIONS)).toEqual({
      echoed: true,
    });

    // Ends inside an escape and inside a token: neither is one.
    const chunks = [
      fill(2000),
      Buffer.from('a%2'),
      fill(2000),
      Buffer.from(`${TOKEN.slice(0, 10)}&#4`),
    ];
    const result = await screenStream(
      Readable.from(chunks),
      NEEDLES,
      1024,
      () => undefined,
      OPTIONS,
    );
    if (!('body' in result) || Buffer.isBuffer(result.body)) throw new Error('not streamed');
    expect((await relayed(result.body)).equals(Buffer.concat(chunks))).toBe(true);
  });

  it.each(Object.entries(ENCODINGS).filter((_, i) => i % 4 === 0))(
    'cuts a long stream off at a late echo (%s), having relayed none of it',
    async (_name, encode) => {
      const echo = Buffer.from(encode(HEADER));
      const half = Math.floor(echo.length / 2);
      const chunks = [fill(5000), echo.subarray(0, half), echo.subarray(half), fill(100)];
      let late = 0;
      const result = await screenStream(
        Readable.from(chunks),
        NEEDLES,
        1024,
        () => late++,
        OPTIONS,
      );
      if (!('body' in result) || Buffer.isBuffer(result.body)) throw new Error('not streamed');
      const seen: Buffer[] = [];
      await expect(
        (async () => {
          for await (const c of result.body as Readable) seen.push(c as Buffer);
        })(),
      ).rejects.toThrow('cut off');
      expect(late).toBe(1);
      const got = Buffer.concat(seen);
      expect(got.length).toBeLessThanOrEqual(5000);
      expect(got.includes(echo.subarray(0, 4))).toBe(false);
    },
  );

  it('screens a streamed gzip body without Content-Encoding through its expansion', async () => {
    const inner = Buffer.from(
      `${'{"pad":"'.padEnd(100_000, 'y')}","seen":"${HEADER.toLowerCase()}"}`,
    );
    const gz = gzipSync(inner);
    const pieces = [];
    for (let o = 0; o < gz.length; o += 97) pieces.push(gz.subarray(o, o + 97));
    let late = 0;
    const result = await screenStream(Readable.from(pieces), NEEDLES, 64, () => late++, OPTIONS);
    if ('echoed' in result) {
      expect(late).toBe(0);
      return;
    }
    await expect(relayed(result.body)).rejects.toThrow('cut off');
    expect(late).toBe(1);
  });

  function fill(n: number): Buffer {
    return Buffer.alloc(n, 'x');
  }
});
