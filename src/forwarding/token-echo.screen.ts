import { Readable } from 'node:stream';

/**
 * An answer echoing the request's `Authorization` would hand the fleet's token to a caller that
 * may only have calls forwarded. Keeps the last `longest - 1` bytes seen, so a token split
 * across two chunks is found too.
 */
export class TokenEchoScanner {
  private readonly needles: Buffer[];
  /** Bytes held back from the caller until the next chunk: they may start a token. */
  readonly heldBack: number;
  private tail = Buffer.alloc(0);

  constructor(tokens: readonly string[]) {
    // An empty needle would match everywhere; a token is never empty, but be exact about it.
    this.needles = tokens.filter((t) => t.length > 0).map((t) => Buffer.from(t, 'utf8'));
    this.heldBack = Math.max(0, ...this.needles.map((n) => n.length - 1));
  }

  push(chunk: Buffer): boolean {
    const window = this.tail.length > 0 ? Buffer.concat([this.tail, chunk]) : chunk;
    if (this.needles.some((n) => window.includes(n))) return true;
    // A copy: the chunk's memory may be pooled and reused by the stream.
    this.tail = Buffer.from(window.subarray(Math.max(0, window.length - this.heldBack)));
    return false;
  }
}

export function echoesToken(body: Buffer, tokens: readonly string[]): boolean {
  return new TokenEchoScanner(tokens).push(body);
}

/**
 * Reads up to `decideBytes` before relaying, so a short answer can still be refused with a
 * status; a longer one is screened as it streams and cut off at a late token. Bytes that could
 * start a token are held back until the next chunk shows they do not.
 */
export async function screenStream(
  body: Readable,
  tokens: readonly string[],
  decideBytes: number,
  onLateEcho: () => void,
): Promise<{ readonly echoed: true } | { readonly body: Buffer | Readable }> {
  const scanner = new TokenEchoScanner(tokens);
  const chunks = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const held: Buffer[] = [];
  let size = 0;
  for (;;) {
    const next = await chunks.next();
    if (next.done) return { body: Buffer.concat(held, size) };
    const chunk = next.value;
    if (scanner.push(chunk)) {
      body.destroy();
      return { echoed: true };
    }
    held.push(chunk);
    size += chunk.length;
    if (size > decideBytes) break;
  }
  const keep = scanner.heldBack;
  async function* rest(): AsyncGenerator<Buffer> {
    let pending = Buffer.concat(held, size);
    try {
      for (;;) {
        if (pending.length > keep) {
          yield pending.subarray(0, pending.length - keep);
          pending = pending.subarray(pending.length - keep);
        }
        const next = await chunks.next();
        if (next.done) break;
        if (scanner.push(next.value)) {
          onLateEcho();
          throw new Error('the provider answer contained the access token: cut off');
        }
        pending = Buffer.concat([pending, next.value]);
      }
      if (pending.length > 0) yield pending;
    } finally {
      // Cut off, or the caller went away: the provider's answer is not read any further.
      body.destroy();
    }
  }
  return { body: Readable.from(rest(), { objectMode: false }) };
}
