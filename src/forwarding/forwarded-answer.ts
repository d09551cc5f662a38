import type { Readable } from 'node:stream';
import type { ApiFailure, ApiOutcome } from '../provider/provider-api.client';
import { translateTransportError } from '../provider/provider-http';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { echoesToken, screenStream } from './token-echo.screen';

/** A provider answer on its way back: the body streams unless collected for a key. */
export interface ForwardedAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: Readable | Buffer;
}

/** The answer with only the `names` headers, renamed as they say. */
export function passed(
  outcome: ApiOutcome,
  names: ReadonlyMap<string, string>,
): ForwardedAnswer | ApiFailure {
  if (outcome.kind === 'failed') return outcome;
  return {
    kind: 'answered',
    status: outcome.status,
    headers: returned(outcome.headers, names),
    body: outcome.body,
  };
}

/** At most `limit` bytes, else outcome unknown: the provider did process it. */
export async function collected(
  outcome: ApiOutcome,
  limit: number,
  names: ReadonlyMap<string, string>,
): Promise<ForwardedAnswer | ApiFailure> {
  if (outcome.kind === 'failed') return outcome;
  if (Buffer.isBuffer(outcome.body)) {
    return outcome.body.length <= limit
      ? passed(outcome, names)
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
 * `'echoed'` when what would be relayed contains a token sent for this exchange; a token found
 * after relaying has begun cuts the body off and calls `onLateEcho`.
 */
export async function screened(
  answer: ForwardedAnswer,
  tokens: readonly string[],
  onLateEcho: () => void,
): Promise<ForwardedAnswer | ApiFailure | 'echoed'> {
  // The returned headers too: a debugging redirect may carry it in `Location`.
  if (echoesToken(Buffer.from(Object.values(answer.headers).join('\n')), tokens)) {
    if (!Buffer.isBuffer(answer.body)) answer.body.destroy();
    return 'echoed';
  }
  if (Buffer.isBuffer(answer.body)) return echoesToken(answer.body, tokens) ? 'echoed' : answer;
  return screenStream(answer.body, tokens, SCREEN_BEFORE_RELAY_BYTES, onLateEcho).then(
    (result) => ('echoed' in result ? 'echoed' : { ...answer, body: result.body }),
    readFailed,
  );
}

/** An answer whose body failed while being read: it may have been acted on, so never resent. */
function readFailed(cause: unknown): ApiFailure {
  const error = translateTransportError(cause, 'reading the provider answer');
  return { kind: 'failed', delivered: 'maybe', error };
}
