import { Transform, type Readable } from 'node:stream';
import { promisify } from 'node:util';
import * as zlib from 'node:zlib';
import type { ApiFailure, ApiOutcome, ApiRequest } from '../provider/provider-api.client';
import { translateTransportError } from '../provider/provider-http';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { echoesToken, echoNeedles, screenBody, screenStream } from './token-echo.screen';

/** A provider answer on its way back: the body streams unless collected for a key. */
export interface ForwardedAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: Readable | Buffer;
}

/** The size limit of a provider answer, and the setting that sets it. */
export type AnswerLimit = Pick<ApiRequest, 'maxResponseBytes' | 'limitSetting'>;

/** The answer, decoded, with only the `names` headers, renamed as they say. */
export async function passed(
  received: ApiOutcome,
  names: ReadonlyMap<string, string>,
  limit: AnswerLimit,
): Promise<ForwardedAnswer | ApiFailure> {
  const outcome = await decoded(received, limit);
  if (outcome.kind === 'failed') return outcome;
  return {
    kind: 'answered',
    status: outcome.status,
    headers: returned(outcome.headers, names),
    body: outcome.body,
  };
}

/** Decoded, at most `limit` bytes, else outcome unknown: the provider did process it. */
export async function collected(
  received: ApiOutcome,
  limit: number,
  names: ReadonlyMap<string, string>,
  answerLimit: AnswerLimit,
): Promise<ForwardedAnswer | ApiFailure> {
  const outcome = await decoded(received, answerLimit);
  if (outcome.kind === 'failed') return outcome;
  if (Buffer.isBuffer(outcome.body)) {
    return outcome.body.length <= limit
      ? passed(outcome, names, answerLimit)
      : tooLargeToStore(outcome.status, limit);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of outcome.body) {
      size += (chunk as Buffer).length;
      if (size > limit) {
        outcome.body.destroy();
        return tooLargeToStore(outcome.status, limit);
      }
      chunks.push(chunk as Buffer);
    }
  } catch (cause) {
    return readFailed(cause);
  }
  const headers = returned(outcome.headers, names);
  delete headers['content-length'];
  return { kind: 'answered', status: outcome.status, headers, body: Buffer.concat(chunks, size) };
}

/** The content codings the broker decodes; it asks for `identity` and expects nothing else. */
const DECODERS = {
  gzip: { whole: promisify(zlib.gunzip), stream: zlib.createGunzip },
  'x-gzip': { whole: promisify(zlib.gunzip), stream: zlib.createGunzip },
  deflate: { whole: promisify(zlib.inflate), stream: zlib.createInflate },
  br: { whole: promisify(zlib.brotliDecompress), stream: zlib.createBrotliDecompress },
} as const;
type Coding = keyof typeof DECODERS;

/** More codings on one answer is no provider's doing. */
const MAX_CODINGS = 3;

/**
 * The answer in `identity`, without `Content-Encoding` or the encoded `Content-Length`, so that
 * what is screened is what the caller reads, and is labelled as what it is. Decoded bytes are
 * bounded as received ones are; a coding the broker cannot decode is never relayed raw.
 */
async function decoded(outcome: ApiOutcome, limit: AnswerLimit): Promise<ApiOutcome> {
  if (outcome.kind === 'failed') return outcome;
  const headers = { ...outcome.headers };
  const encoding = headers['content-encoding'];
  delete headers['content-encoding'];
  delete headers['content-length'];
  const codings = (Array.isArray(encoding) ? encoding.join(',') : (encoding ?? ''))
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
  if (codings.length === 0) return outcome;
  const { status, body } = outcome;
  if (codings.length > MAX_CODINGS || !codings.every((c): c is Coding => c in DECODERS)) {
    if (!Buffer.isBuffer(body)) body.destroy();
    const error = new ProviderException(
      ProviderErrorCode.MalformedResponse,
      `the provider answered HTTP ${status} in a Content-Encoding the broker cannot decode (it asks for identity, and decodes gzip, x-gzip, deflate and br), so the answer is not relayed`,
      { status },
    );
    return { kind: 'failed', delivered: 'maybe', error };
  }
  // Applied in the order listed: undone last first.
  const order = [...codings].reverse();
  const tooLarge = (cause?: unknown) =>
    new ProviderException(
      ProviderErrorCode.MalformedResponse,
      `the provider answered HTTP ${status} with a ${codings.join(', ')} body over ${limit.maxResponseBytes} bytes once decoded (${limit.limitSetting})`,
      { status, cause },
    );
  const undecodable = (cause: unknown) =>
    new ProviderException(
      ProviderErrorCode.MalformedResponse,
      `the provider answered HTTP ${status} with a body that is not valid ${codings.join(', ')} as its Content-Encoding says`,
      { status, cause },
    );
  if (!Buffer.isBuffer(body)) {
    return { ...outcome, headers, body: decodedStream(body, order, limit, tooLarge, undecodable) };
  }
  // No body (HEAD, 204, 304): nothing to decode, only the labels to drop.
  let bytes = body;
  try {
    for (const coding of order) {
      if (bytes.length === 0) break;
      bytes = await DECODERS[coding].whole(bytes, { maxOutputLength: limit.maxResponseBytes });
    }
  } catch (cause) {
    const code = (cause as { code?: unknown }).code;
    const error = code === 'ERR_BUFFER_TOO_LARGE' ? tooLarge(cause) : undecodable(cause);
    return { kind: 'failed', delivered: 'maybe', error };
  }
  return { ...outcome, headers, body: bytes };
}

/** The answer read through its decoders as it streams; errors as a translated failure. */
function decodedStream(
  body: Readable,
  order: readonly Coding[],
  limit: AnswerLimit,
  tooLarge: () => ProviderException,
  undecodable: (cause: unknown) => ProviderException,
): Readable {
  const decoders = order.map((coding) => DECODERS[coding].stream());
  let received = 0;
  let size = 0;
  const out = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      size += chunk.length;
      if (size > limit.maxResponseBytes) done(tooLarge());
      else done(null, chunk);
    },
    // The caller gone, or a failure: the provider's answer is not read any further.
    destroy(err, done) {
      body.destroy();
      for (const decoder of decoders) decoder.destroy();
      done(err);
    },
  });
  body.on('data', (chunk: Buffer) => (received += chunk.length));
  body.once('error', (err) => out.destroy(err));
  for (const decoder of decoders) {
    decoder.once('error', (err) => {
      // An empty body (HEAD) is no compressed stream, and no fault.
      if (received === 0) {
        if (!out.writableEnded) out.end();
      } else out.destroy(undecodable(err));
    });
  }
  decoders.reduce<Readable>((from, to) => from.pipe(to), body).pipe(out);
  return out;
}

function tooLargeToStore(status: number, limit: number): ApiFailure {
  const error = new ProviderException(
    ProviderErrorCode.MalformedResponse,
    `the provider answered HTTP ${status} with a body over ${limit} bytes, too large to keep for Idempotency-Key replays (FORWARD_MAX_STORED_RESPONSE_BYTES)`,
    { status },
  );
  return { kind: 'failed', delivered: 'maybe', error };
}

function returned(
  headers: Record<string, string | string[] | undefined>,
  names: ReadonlyMap<string, string>,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const as = names.get(name.toLowerCase());
    if (as === undefined || value === undefined) continue;
    out[as] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}

/** How much of a streamed answer is read before its status is relayed, to screen it whole. */
const SCREEN_BEFORE_RELAY_BYTES = 64 * 1024;

/**
 * `'echoed'` when what would be relayed, headers or body, contains a token sent for this
 * exchange in one of the spellings the screen reads; a token found after relaying has begun cuts
 * the body off and calls `onLateEcho`.
 */
export async function screened(
  answer: ForwardedAnswer,
  tokens: readonly string[],
  limit: AnswerLimit,
  onLateEcho: () => void,
): Promise<ForwardedAnswer | ApiFailure | 'echoed'> {
  const needles = echoNeedles(tokens);
  // The returned headers too: a debugging redirect may carry it in `Location`, hex in `ETag`.
  if (echoesToken(Buffer.from(Object.values(answer.headers).join('\n')), needles)) {
    if (!Buffer.isBuffer(answer.body)) answer.body.destroy();
    return 'echoed';
  }
  const options = {
    maxExpandedBytes: limit.maxResponseBytes,
    tooLarge: () =>
      new ProviderException(
        ProviderErrorCode.MalformedResponse,
        `the provider answered HTTP ${answer.status} with compressed data (no Content-Encoding) that expands past ${limit.maxResponseBytes} bytes (${limit.limitSetting}), too large to screen for the access token`,
        { status: answer.status },
      ),
  };
  try {
    if (Buffer.isBuffer(answer.body)) {
      return (await screenBody(answer.body, needles, options)) ? 'echoed' : answer;
    }
    const result = await screenStream(
      answer.body,
      needles,
      SCREEN_BEFORE_RELAY_BYTES,
      onLateEcho,
      options,
    );
    return 'echoed' in result ? 'echoed' : { ...answer, body: result.body };
  } catch (cause) {
    return readFailed(cause);
  }
}

/** An answer whose body failed while being read: it may have been acted on, so never resent. */
function readFailed(cause: unknown): ApiFailure {
  const error = translateTransportError(cause, 'reading the provider answer');
  return { kind: 'failed', delivered: 'maybe', error };
}
