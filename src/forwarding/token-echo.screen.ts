import { Readable } from 'node:stream';
import { constants, createGunzip, createInflate, type Gunzip, type Inflate } from 'node:zlib';

/*
 * An answer echoing the request's `Authorization` would hand the fleet's token to a caller that
 * may only have calls forwarded. Providers echo it in many spellings (escaped by their JSON or
 * HTML encoder, percent-encoded in a redirect, base64 or hex in a debug field or an ETag), so the
 * screen reads what it is given in one canonical spelling: in lower case, with the escapes below
 * decoded. A token is looked for in that spelling as itself, in hex, and as the base64 and
 * base64url of each of its three alignments. Every form of `Bearer <token>` holds one of those,
 * so the header is found too. Folding can only add matches, and a needle is a token's worth of
 * random characters: a clean answer matches by chance with negligible probability.
 *
 * Native string operations do the work (a byte loop in JavaScript is several times slower on a
 * large answer): the text is lower-cased whole, escapes are found with `indexOf`, and the runs
 * between them are sliced.
 */

/**
 * The longest escape decoded, in bytes (`&underbar;`, `&#x00002f;`): what one canonical character
 * can have been in the answer, so a match can start at most this many bytes per character back.
 */
const MAX_ESCAPE_BYTES = 10;

/** Named HTML references of the characters a bearer token holds, and `&amp;`. */
const ENTITIES = new Map([
  ['amp', '&'],
  ['sol', '/'],
  ['plus', '+'],
  ['equals', '='],
  ['period', '.'],
  ['lowbar', '_'],
  ['underbar', '_'],
]);

/** The bytes that may start an escape: `\`, `%`, `&`. */
const ESCAPE_STARTS = new Set([0x5c, 0x25, 0x26]);

/** The needles of one call's tokens, in the canonical spelling; built once per call. */
export interface EchoNeedles {
  readonly needles: readonly string[];
  /** The longest needle's length; 0 without a needle. */
  readonly longest: number;
}

/** The forms each token is looked for in: itself, hex, and base64 in each of its alignments. */
export function echoNeedles(tokens: readonly string[]): EchoNeedles {
  const forms = new Set<string>();
  for (const token of tokens) {
    const bytes = Buffer.from(token, 'utf8');
    forms.add(token).add(bytes.toString('hex'));
    // Inside longer base64 text a token's bytes start at any offset from a 3-byte group: each
    // alignment's whole groups encode the same way wherever the token sits.
    for (let skip = 0; skip < 3; skip++) {
      const groups = bytes.subarray(skip, skip + 3 * Math.floor((bytes.length - skip) / 3));
      forms.add(groups.toString('base64')).add(groups.toString('base64url'));
    }
  }
  const needles = [...new Set([...forms].map((form) => canonical(form.toLowerCase())))].filter(
    (needle) => needle.length > 0,
  );
  return { needles, longest: Math.max(0, ...needles.map((n) => n.length)) };
}

/**
 * Lower-cased `text` with its escapes of ASCII characters decoded: JSON (`\/`, `\u002f`),
 * JavaScript (`\x2f`), percent (`%2f`, and `escape`'s `%u002f`) and HTML (`&#x2f;`, `&#47;`,
 * `&sol;`; a numeric one's `;` optional, as HTML parsers allow). Plain runs are sliced, not
 * copied character by character.
 */
function canonical(lower: string): string {
  const cursors = [-1, -1, -1];
  const parts: string[] = [];
  let from = 0;
  for (let at = nextEscape(lower, 0, cursors); at >= 0; ) {
    const escape = decodedAt(lower, at);
    if (escape === undefined) {
      at = nextEscape(lower, at + 1, cursors);
      continue;
    }
    parts.push(lower.slice(from, at), escape.char);
    from = at + escape.length;
    at = nextEscape(lower, from, cursors);
  }
  if (parts.length === 0) return lower;
  parts.push(lower.slice(from));
  return parts.join('');
}

const STARTS = ['\\', '%', '&'];

/** The next `\`, `%` or `&` from `from`; `cursors` keeps each one's last find, so no rescans. */
function nextEscape(text: string, from: number, cursors: number[]): number {
  let next = -1;
  for (let k = 0; k < 3; k++) {
    if (cursors[k] !== -2 && cursors[k] < from) {
      const found = text.indexOf(STARTS[k], from);
      cursors[k] = found === -1 ? -2 : found;
    }
    if (cursors[k] >= 0 && (next === -1 || cursors[k] < next)) next = cursors[k];
  }
  return next;
}

/** The ASCII character an escape at `i` stands for, and its length; `undefined` if none. */
function decodedAt(text: string, i: number): { char: string; length: number } | undefined {
  const c = text[i];
  const next = text[i + 1];
  if (c === '\\') {
    if (next === '/') return { char: '/', length: 2 };
    if (next === 'u') return ascii(text, i + 2, 4, 16, 6);
    if (next === 'x') return ascii(text, i + 2, 2, 16, 4);
    return undefined;
  }
  if (c === '%') return next === 'u' ? ascii(text, i + 2, 4, 16, 6) : ascii(text, i + 1, 2, 16, 3);
  if (next === '#') {
    const hex = text[i + 2] === 'x';
    const first = hex ? i + 3 : i + 2;
    let end = first;
    while (end < first + (hex ? 6 : 7) && digit(text.charCodeAt(end), hex ? 16 : 10) >= 0) end++;
    if (end === first) return undefined;
    const length = end - i + (text[end] === ';' ? 1 : 0);
    return ascii(text, first, end - first, hex ? 16 : 10, length);
  }
  let semicolon = i + 1;
  while (semicolon < i + MAX_ESCAPE_BYTES - 1 && isLetter(text.charCodeAt(semicolon))) semicolon++;
  if (text[semicolon] !== ';') return undefined;
  const char = ENTITIES.get(text.slice(i + 1, semicolon));
  return char === undefined ? undefined : { char, length: semicolon + 1 - i };
}

/** `digits` digits in `radix` at `i`, decoded if they are an ASCII character. */
function ascii(
  text: string,
  i: number,
  digits: number,
  radix: number,
  length: number,
): { char: string; length: number } | undefined {
  let value = 0;
  for (let j = i; j < i + digits; j++) {
    const d = digit(text.charCodeAt(j), radix);
    if (d < 0) return undefined;
    value = value * radix + d;
  }
  // Only ASCII (a token holds nothing else; the rest is read as written), in lower case as all is.
  return value < 0x80 ? { char: String.fromCharCode(value).toLowerCase(), length } : undefined;
}

function isLetter(code: number): boolean {
  return code >= 0x61 && code <= 0x7a;
}

/** A lower-case digit's value in `radix` (10 or 16), or -1. */
function digit(code: number, radix: number): number {
  if (code >= 0x30 && code <= 0x39) return code - 0x30;
  return radix === 16 && code >= 0x61 && code <= 0x66 ? code - 0x57 : -1;
}

/**
 * Looks for the needles in an answer read in chunks. Keeps the last `longest - 1` canonical
 * characters, and an escape a chunk may end inside, so a token split across chunks is found too.
 */
export class TokenEchoScanner {
  /**
   * Bytes of the answer held back from the caller until the next chunk: they may start a token.
   * Each canonical character kept can have been up to {@link MAX_ESCAPE_BYTES} answer bytes.
   */
  readonly heldBack: number;
  private tail = '';
  private pending = Buffer.alloc(0);

  constructor(private readonly needles: EchoNeedles) {
    this.heldBack = needles.longest === 0 ? 0 : needles.longest * MAX_ESCAPE_BYTES - 1;
  }

  push(chunk: Buffer): boolean {
    return this.scan(chunk, false);
  }

  /** The answer ended: an escape left incomplete is read as it was written. */
  end(): boolean {
    return this.pending.length > 0 && this.scan(Buffer.alloc(0), true);
  }

  private scan(chunk: Buffer, final: boolean): boolean {
    const { needles, longest } = this.needles;
    if (longest === 0) return false;
    const input = this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : chunk;
    let upto = input.length;
    // An escape may start in the last bytes and end in the next chunk: those wait for it.
    if (!final) {
      for (let i = Math.max(0, input.length - (MAX_ESCAPE_BYTES - 1)); i < upto; i++) {
        if (ESCAPE_STARTS.has(input[i])) upto = i;
      }
    }
    // latin1: one character per byte, so a byte count is a character count.
    const text = this.tail + canonical(input.toString('latin1', 0, upto).toLowerCase());
    for (const needle of needles) if (text.includes(needle)) return true;
    this.tail = text.slice(Math.max(0, text.length - (longest - 1)));
    // A copy: the chunk's memory may be pooled and reused by the stream.
    this.pending = Buffer.from(input.subarray(upto));
    return false;
  }
}

/** Whether `text`, whole, holds a needle (the headers returned to the caller). */
export function echoesToken(text: Buffer, needles: EchoNeedles): boolean {
  const scanner = new TokenEchoScanner(needles);
  return scanner.push(text) || scanner.end();
}

/** How a body is screened. */
export interface ScreenOptions {
  /** The most bytes a compressed body's copy is expanded to (the answer's size limit). */
  readonly maxExpandedBytes: number;
  /** The error thrown when a compressed body expands past `maxExpandedBytes`. */
  readonly tooLarge: () => Error;
}

/**
 * The body as relayed, and, when it starts as gzip or zlib data does, a decompressed copy of it:
 * a provider that compresses without saying so (no `Content-Encoding`) hands the caller the token
 * all the same. The copy is only looked at; the caller gets the body as it came.
 */
class BodyScreen {
  private readonly plain: TokenEchoScanner;
  /** `undefined` until two bytes were seen; `null` when the body is not compressed. */
  private copy: CompressedCopy | null | undefined;
  private head = Buffer.alloc(0);

  constructor(
    private readonly needles: EchoNeedles,
    private readonly options: ScreenOptions,
  ) {
    this.plain = new TokenEchoScanner(needles);
  }

  get heldBack(): number {
    return this.plain.heldBack;
  }

  async push(chunk: Buffer): Promise<boolean> {
    if (this.plain.push(chunk)) return true;
    if (this.copy === null) return false;
    if (this.copy) return this.copy.push(chunk);
    this.head = Buffer.concat([this.head, chunk]);
    if (this.head.length < 2) return false;
    const kind = compression(this.head);
    this.copy = kind && new CompressedCopy(kind, this.needles, this.options);
    const head = this.head;
    this.head = Buffer.alloc(0);
    return this.copy !== null && this.copy.push(head);
  }

  async end(): Promise<boolean> {
    return this.plain.end() || (this.copy ? this.copy.end() : false);
  }
}

/** gzip's magic number, or a zlib header (RFC 1950: deflate, and a check that is a multiple of 31). */
function compression(head: Buffer): 'gzip' | 'zlib' | null {
  if (head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if ((head[0] & 0x0f) === 8 && head[0] >> 4 <= 7 && head.readUInt16BE(0) % 31 === 0) return 'zlib';
  return null;
}

/** A compressed body's copy, expanded as it arrives; a copy that fails to expand is not screened. */
class CompressedCopy {
  private readonly scanner: TokenEchoScanner;
  private readonly decoder: Gunzip | Inflate;
  private readonly output: Buffer[] = [];
  private size = 0;
  private failed = false;

  constructor(
    kind: 'gzip' | 'zlib',
    needles: EchoNeedles,
    private readonly options: ScreenOptions,
  ) {
    this.scanner = new TokenEchoScanner(needles);
    // A truncated stream is still read as far as it goes.
    const settings = { finishFlush: constants.Z_SYNC_FLUSH };
    this.decoder = kind === 'gzip' ? createGunzip(settings) : createInflate(settings);
    this.decoder.on('data', (out: Buffer) => this.output.push(out));
    this.decoder.on('error', () => (this.failed = true));
  }

  /** Expands `chunk` before answering, so no byte is relayed before its expansion was seen. */
  async push(chunk: Buffer): Promise<boolean> {
    if (this.failed) return false;
    this.decoder.write(chunk);
    await this.settled((done) => this.decoder.flush(done));
    return this.scan();
  }

  async end(): Promise<boolean> {
    if (this.failed) return false;
    await this.settled((done) => this.decoder.end(done));
    return this.scan() || (!this.failed && this.scanner.end());
  }

  /** `start`'s callback, or the decoder's error: zlib does not call back after one. */
  private async settled(start: (done: () => void) => void): Promise<void> {
    let fail: () => void = () => undefined;
    await new Promise<void>((resolve) => {
      fail = resolve;
      this.decoder.once('error', fail);
      start(() => resolve());
    });
    this.decoder.off('error', fail);
    // Output the decoder pushed while not flowing reaches 'data' on the next tick.
    await new Promise((resolve) => setImmediate(resolve));
  }

  private scan(): boolean {
    for (const out of this.output.splice(0)) {
      this.size += out.length;
      if (this.size > this.options.maxExpandedBytes) {
        this.decoder.destroy();
        throw this.options.tooLarge();
      }
      if (this.scanner.push(out)) return true;
    }
    return false;
  }
}

/** Whether a body read whole holds a needle, itself or (compressed) expanded. */
export async function screenBody(
  body: Buffer,
  needles: EchoNeedles,
  options: ScreenOptions,
): Promise<boolean> {
  const screen = new BodyScreen(needles, options);
  return (await screen.push(body)) || screen.end();
}

/**
 * Reads up to `decideBytes` before relaying, so a short answer can still be refused with a
 * status; a longer one is screened as it streams and cut off at a late token. Bytes that could
 * start a token are held back until the next chunk shows they do not.
 */
export async function screenStream(
  body: Readable,
  needles: EchoNeedles,
  decideBytes: number,
  onLateEcho: () => void,
  options: ScreenOptions,
): Promise<{ readonly echoed: true } | { readonly body: Buffer | Readable }> {
  const screen = new BodyScreen(needles, options);
  const chunks = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const held: Buffer[] = [];
  let size = 0;
  const echoed = () => {
    body.destroy();
    return { echoed: true } as const;
  };
  for (;;) {
    const next = await chunks.next();
    if (next.done) return (await screen.end()) ? echoed() : { body: Buffer.concat(held, size) };
    const chunk = next.value;
    if (await screen.push(chunk)) return echoed();
    held.push(chunk);
    size += chunk.length;
    if (size > decideBytes) break;
  }
  const keep = screen.heldBack;
  async function* rest(): AsyncGenerator<Buffer> {
    let pending = Buffer.concat(held, size);
    const cutOff = () => {
      onLateEcho();
      return new Error('the provider answer contained the access token: cut off');
    };
    try {
      for (;;) {
        if (pending.length > keep) {
          yield pending.subarray(0, pending.length - keep);
          pending = pending.subarray(pending.length - keep);
        }
        const next = await chunks.next();
        if (next.done) break;
        if (await screen.push(next.value)) throw cutOff();
        pending = Buffer.concat([pending, next.value]);
      }
      if (await screen.end()) throw cutOff();
      if (pending.length > 0) yield pending;
    } finally {
      // Cut off, or the caller went away: the provider's answer is not read any further.
      body.destroy();
    }
  }
  return { body: Readable.from(rest(), { objectMode: false }) };
}
