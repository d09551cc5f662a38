import { Readable } from 'node:stream';
import type { ClientConfig, RejectionEvidence } from '../config/client.schema';
import type { ForwardedAnswer } from './forwarded-answer';
import type { ForwardingProfile } from './forwarding.exception';

/** How much of a 401's body is read for a client's `bodyMarker`. */
export const MARKER_WINDOW_BYTES = 4096;

/** RFC 6750 §3.1: the resource server says the access token itself is the problem. */
const INVALID_TOKEN = /(?:^|[\s,])error\s*=\s*"?invalid_token"?/i;

/**
 * Whether a provider 401's headers say the token was refused. A 401 that does not say so may
 * come from a reason the caller controls (a wrong one-time code, a missing consent), so unless
 * the client's policy is `any`, it is relayed as it is and costs the fleet nothing.
 */
export function headersRefuseToken(
  headers: Readonly<Record<string, string | string[] | undefined>>,
): boolean {
  const challenge = headers['www-authenticate'];
  const values = Array.isArray(challenge) ? challenge : challenge === undefined ? [] : [challenge];
  return values.some((v) => /^\s*(?:DPoP|Bearer)\b/i.test(v) && INVALID_TOKEN.test(v));
}

/** The client's policy for one kind of call. */
export function evidenceRule(client: ClientConfig, profile: ForwardingProfile): RejectionEvidence {
  const rule = client.tokenRejection;
  if (profile === 'forward') return rule.forward;
  return rule.orders ?? (client.tokenRequest.grant === 'provider-query' ? 'any' : 'invalid_token');
}

/**
 * Whether a 401 answer marks the token refused, by the client's `bodyMarker`; the answer comes
 * back whole to relay: a streamed body is read up to {@link MARKER_WINDOW_BYTES} and the rest
 * follows unread.
 */
export async function bodyMarks(
  answer: ForwardedAnswer,
  marker: string,
): Promise<{ marked: boolean; answer: ForwardedAnswer }> {
  const needle = Buffer.from(marker, 'utf8');
  if (Buffer.isBuffer(answer.body)) {
    return { marked: answer.body.subarray(0, MARKER_WINDOW_BYTES).includes(needle), answer };
  }
  const source = answer.body;
  const chunks = source[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const head: Buffer[] = [];
  let size = 0;
  let done = false;
  while (size < MARKER_WINDOW_BYTES) {
    const next = await chunks.next();
    if (next.done) {
      done = true;
      break;
    }
    head.push(next.value);
    size += next.value.length;
  }
  const read = Buffer.concat(head, size);
  const marked = read.subarray(0, MARKER_WINDOW_BYTES).includes(needle);
  if (done) return { marked, answer: { ...answer, body: read } };
  async function* rest(): AsyncGenerator<Buffer> {
    yield read;
    for (;;) {
      const next = await chunks.next();
      if (next.done) return;
      yield next.value;
    }
  }
  return { marked, answer: { ...answer, body: Readable.from(rest(), { objectMode: false }) } };
}
