import { type ClientConfig, FORWARD_METHODS } from '../config/client.schema';
import type { DpopSigner } from '../dpop/dpop-proofs';
import { RequestErrorCode, RequestException } from '../http/request.exception';
import type { TokenRecord } from './token-record';
import { TokenErrorCode, TokenException } from './token.exception';

/** The call a caller names for its one-time proof: `dpop_htm`, `dpop_htu`. */
export interface HandOutTarget {
  readonly method?: string;
  readonly url?: string;
}

/**
 * A DPoP client's token leaves the broker only when the client opts in (`dpop.handOut`), to a
 * caller that may have tokens, for one call it names: method and URL under the client's
 * `baseUrl`. Otherwise `dpop_bound_token`: the token is worthless without the proof key, which
 * never leaves the broker, so the caller is sent to the passthrough.
 */
export function handOutTarget(
  client: ClientConfig,
  tokenCaller: boolean,
  given: HandOutTarget,
): { method: string; url: string } {
  const passthrough = `call the API through the broker instead: /provider/${client.id}/<path> (scope "forward") or POST /orders, which sign a proof per call`;
  if (!tokenCaller || client.dpop?.handOut !== true) {
    throw new TokenException(
      TokenErrorCode.DpopBound,
      `client "${client.id}" holds DPoP-bound tokens (RFC 9449): a token works only with a proof signed by the broker's key, which never leaves it; ${passthrough}`,
    );
  }
  const { method, url } = given;
  if (method === undefined || url === undefined) {
    throw new TokenException(
      TokenErrorCode.DpopBound,
      `client "${client.id}" holds DPoP-bound tokens (RFC 9449): name the one call to sign a proof for with dpop_htm (the HTTP method) and dpop_htu (the URL, under the client's baseUrl), or ${passthrough}`,
    );
  }
  if (!(FORWARD_METHODS as readonly string[]).includes(method)) {
    throw new RequestException(
      RequestErrorCode.InvalidRequest,
      `dpop_htm must be one of ${FORWARD_METHODS.join(', ')}`,
    );
  }
  if (!within(client.baseUrl, url)) {
    throw new RequestException(
      RequestErrorCode.InvalidRequest,
      `dpop_htu must be an absolute URL under client "${client.id}"'s baseUrl, without a fragment`,
    );
  }
  return { method, url };
}

/** Same origin, and the base path a prefix of whole segments. */
function within(baseUrl: string, url: string): boolean {
  if (!URL.canParse(url) || url.includes('#')) return false;
  const base = new URL(baseUrl);
  const target = new URL(url);
  const prefix = base.pathname.endsWith('/') ? base.pathname : `${base.pathname}/`;
  return (
    target.origin === base.origin &&
    (target.pathname === base.pathname || target.pathname.startsWith(prefix)) &&
    !/\/\.\.?(\/|$)|%2e|%2f/i.test(target.pathname)
  );
}

/**
 * RFC 9449 §5's answer plus the proof: `token_type` DPoP, `dpop_proof` for the named call only
 * (fresh `jti`, `iat` now, `ath` of this token, the API's nonce if known), `dpop_htm`/`dpop_htu`
 * as signed. Never cached: each proof is for one use.
 */
export async function handOutBody(
  signer: DpopSigner,
  client: ClientConfig,
  record: TokenRecord,
  target: { method: string; url: string },
  now: number,
): Promise<Buffer> {
  const proof = await signer.proof(client, {
    method: target.method,
    url: target.url,
    accessToken: record.accessToken,
    server: 'rs',
  });
  const url = new URL(target.url);
  return Buffer.from(
    JSON.stringify({
      access_token: record.accessToken,
      token_type: 'DPoP',
      expires_in: Math.max(0, Math.floor((record.expiresAt - now) / 1000)),
      expires_at: new Date(record.expiresAt).toISOString(),
      dpop_proof: proof,
      dpop_htm: target.method,
      dpop_htu: `${url.origin}${url.pathname}`,
    }),
  );
}
