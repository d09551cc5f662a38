import { Readable } from 'node:stream';
import { echoesToken, screenStream, TokenEchoScanner } from './token-echo.screen';

const TOKEN = 'eyJhbGciOiJSUzI1NiJ9.access-token.sig';

describe(TokenEchoScanner.name, () => {
  const body = Buffer.from(`{"headers":{"authorization":"Bearer ${TOKEN}"}}`);

  it('finds the token split at every position, and in pieces smaller than itself', () => {
    for (let cut = 1; cut < body.length; cut++) {
      const scanner = new TokenEchoScanner([TOKEN]);
      const found = [body.subarray(0, cut), body.subarray(cut)].some((c) => scanner.push(c));
      expect([cut, found]).toEqual([cut, true]);
    }
    const bytewise = new TokenEchoScanner([TOKEN]);
    expect([...body].some((b) => bytewise.push(Buffer.from([b])))).toBe(true);
  });

  it('finds any of several tokens, and nothing in an answer without them', () => {
    expect(echoesToken(body, ['other-token', TOKEN])).toBe(true);
    expect(echoesToken(body, ['other-token'])).toBe(false);
    expect(echoesToken(Buffer.from(TOKEN.slice(0, -1)), [TOKEN])).toBe(false);
    expect(echoesToken(body, [''])).toBe(false);
  });
});

describe(screenStream.name, () => {
  it('decides on a short stream whole, and relays a long clean one byte for byte', async () => {
    const short = Readable.from([
      body(10),
      Buffer.from(TOKEN.slice(0, 5)),
      Buffer.from(TOKEN.slice(5)),
    ]);
    expect(await screenStream(short, [TOKEN], 1024, () => undefined)).toEqual({ echoed: true });

    const chunks = [body(2000), body(2000), Buffer.from(TOKEN.slice(0, 10))];
    const result = await screenStream(Readable.from(chunks), [TOKEN], 1024, () => undefined);
    if (!('body' in result) || Buffer.isBuffer(result.body)) throw new Error('not streamed');
    const relayed: Buffer[] = [];
    for await (const c of result.body) relayed.push(c as Buffer);
    expect(Buffer.concat(relayed)).toEqual(Buffer.concat(chunks));
  });

  function body(n: number): Buffer {
    return Buffer.alloc(n, 'x');
  }
});
