import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import type { BrokerConfig } from '../config/config.schema';
import type { BrokerExceptionOptions } from '../errors/broker.exception';
import type { MetricsService } from '../metrics/metrics.service';
import type { ApiFailure } from '../provider/provider-api.client';
import { translateTransportError } from '../provider/provider-http';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { echoesToken, screenStream } from './token-echo.screen';
import type { TokenRecord } from '../token/token-record';
import { TokenException } from '../token/token.exception';
import type { TokenService } from '../token/token.service';
import type { IdempotencyStore, StoredResponse } from './idempotency-store';
import {
  IdempotencyClaims,
  type IdempotencyPolicy,
  type Ledger,
  NO_LEDGER,
} from './idempotency-claims';
import {
  FAILURE_CODES,
  type ForwardingFailure,
  forwardingProblem,
  type ForwardingProfile,
  PROFILES,
} from './forwarding.exception';

/** A request must leave with a token that outlives the trip to the provider. */
const TOKEN_MIN_REMAINING_MS = 2000;

/** A provider answer on its way back: the body streams unless collected for a key. */
export interface ForwardedAnswer {
  readonly kind: 'answered';
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: Readable | Buffer;
}

export interface Exchange {
  readonly clientId: string;
  /** Present with an `Idempotency-Key`; the key's hash is scoped by the use. */
  readonly idempotency?: {
    readonly caller: string;
    readonly keyHash: string;
    readonly bodyHash: string;
  };
  /** Never throws for a transport failure; a collected (keyed) answer has a Buffer body. */
  send(token: TokenRecord): Promise<ForwardedAnswer | ApiFailure>;
}

type ForwardingResult =
  | { readonly kind: 'live'; readonly answer: ForwardedAnswer }
  | { readonly kind: 'replayed'; readonly response: StoredResponse };

/** For the route's audit line: never holds a secret. */
export interface ForwardingAudit {
  tokenFingerprint?: string;
  idempotencyKeyHash?: string;
  /** Provider calls made: 0 (replayed or refused), 1, or 2 (after a 401). */
  attempts: number;
}

/**
 * Never repeats a request that may have reached the provider; the one retry follows a 401,
 * which the provider answers before looking at the request. The rejected token is invalidated
 * fenced, so a storm of 401s across the fleet costs one token request.
 */
export class Forwarding {
  private readonly claims: IdempotencyClaims;
  private readonly words: (typeof PROFILES)[ForwardingProfile];

  constructor(
    private readonly tokens: Pick<TokenService, 'getToken' | 'replaceRejected'>,
    store: IdempotencyStore,
    config: Pick<BrokerConfig, 'orders' | 'token'>,
    private readonly metrics: Pick<
      MetricsService,
      'providerLatency' | 'idempotentReplays' | 'upstreamTokenEchoes'
    >,
    private readonly logger: Logger,
    private readonly profile: ForwardingProfile,
    policy: IdempotencyPolicy,
  ) {
    this.words = PROFILES[profile];
    this.claims = new IdempotencyClaims(store, config, policy, metrics, logger, profile);
  }

  async forward(exchange: Exchange, audit: ForwardingAudit): Promise<ForwardingResult> {
    const { clientId, idempotency } = exchange;
    let ledger = NO_LEDGER;
    if (idempotency !== undefined) {
      const { caller, keyHash, bodyHash } = idempotency;
      audit.idempotencyKeyHash = keyHash.slice(0, 16);
      const claim = await this.claims.claim({ clientId, caller, keyHash }, bodyHash);
      if ('replay' in claim) return { kind: 'replayed', response: claim.replay };
      ledger = claim.ledger;
    }
    let outcome: ForwardedAnswer | ApiFailure;
    const sent: string[] = [];
    try {
      outcome = await this.send(exchange, audit, sent);
    } catch (err) {
      // No token, or every token refused with 401: nothing reached the provider that it
      // accepted, so the key may be used again. Anything unexpected errs on the safe side.
      const refused = err instanceof TokenException || err instanceof TokenRejected;
      await (refused ? ledger.release() : ledger.markUnknown());
      throw err instanceof TokenRejected ? err.problem : err;
    }
    if (outcome.kind === 'answered') {
      const status = outcome.status;
      const checked = await screened(outcome, sent, () =>
        this.echoed(exchange.clientId, status, true),
      );
      if (checked === 'echoed') {
        this.echoed(exchange.clientId, status, false);
        // Processed, or refused: the provider answered, and only a 429 certainly did nothing.
        await (status === 429 ? ledger.release() : ledger.markUnknown());
        const noun = this.words.noun;
        const repeat =
          idempotency === undefined || status === 429
            ? ''
            : ` A repeat with the same Idempotency-Key answers 409 ${FAILURE_CODES.outcomeUnknown[this.profile]}.`;
        throw this.fail(
          'echoedToken',
          `the provider answered HTTP ${status} with an answer that contains the access token the broker sent it, so the answer is withheld (neither relayed nor stored); the ${noun} may have been processed.${repeat} Check with the provider, and have the provider endpoint fixed so that it does not echo the Authorization header`,
        );
      }
      outcome = checked;
    }
    return this.conclude(exchange, outcome, ledger, idempotency !== undefined);
  }

  private echoed(clientId: string, status: number, late: boolean): void {
    this.metrics.upstreamTokenEchoes.labels(clientId, this.words.call).inc();
    this.logger.error(
      { client: clientId, status, call: this.words.call },
      late
        ? 'provider answer contained the access token after relaying had begun: cut off'
        : 'provider answer contained the access token: withheld, answered 502',
    );
  }

  /** The token layer never hands a rejected token out again (`replaceRejected`). */
  private async send(
    exchange: Exchange,
    audit: ForwardingAudit,
    sent: string[],
  ): Promise<ForwardedAnswer | ApiFailure> {
    const { clientId } = exchange;
    // The first token, then once more with a fresh one after a 401.
    for (let tries = 0; tries < 2; tries++) {
      const token = await this.tokens.getToken(clientId, TOKEN_MIN_REMAINING_MS);
      sent.push(token.accessToken);
      const outcome = await this.attempt(exchange, token, audit);
      if (!isUnauthorized(outcome)) return outcome;
      discard(outcome);
      // Fenced: a no-op when another request (or replica) already replaced this token.
      await this.tokens.replaceRejected(clientId, token.fingerprint);
    }
    const noun = this.words.noun;
    throw new TokenRejected(
      this.fail(
        'tokenRejected',
        `the provider refused a freshly obtained token for client "${clientId}" too (HTTP 401); no ${noun} was created. Check that the merchant's credentials are enabled for this API in this environment`,
      ),
    );
  }

  private async attempt(
    exchange: Exchange,
    token: TokenRecord,
    audit: ForwardingAudit,
  ): Promise<ForwardedAnswer | ApiFailure> {
    audit.attempts++;
    audit.tokenFingerprint = token.fingerprint;
    const started = performance.now();
    const outcome = await exchange.send(token);
    const statusClass =
      outcome.kind === 'answered' ? `${Math.floor(outcome.status / 100)}xx` : 'none';
    this.metrics.providerLatency
      .labels(this.words.call, statusClass)
      .observe((performance.now() - started) / 1000);
    return outcome;
  }

  private async conclude(
    exchange: Exchange,
    outcome: ForwardedAnswer | ApiFailure,
    ledger: Ledger,
    withKey: boolean,
  ): Promise<ForwardingResult> {
    const noun = this.words.noun;
    if (outcome.kind === 'answered') {
      // 429: rate limited, refused before processing, so a retry under the same key is safe
      // (and replaying a stale 429 for a day would block it).
      if (outcome.status === 429) await ledger.release();
      else if (withKey) {
        const { status, headers, body } = outcome;
        await ledger.complete({
          status,
          contentType: headers['content-type'],
          body: body as Buffer,
        });
      }
      return { kind: 'live', answer: outcome };
    }
    const { error } = outcome;
    if (outcome.delivered === 'no') {
      await ledger.release();
      throw this.fail(
        'unreachable',
        `${error.message}; the ${noun} was not sent, so it is safe to retry`,
        { retryAfterSeconds: 2, cause: error },
      );
    }
    await ledger.markUnknown();
    const advice = withKey
      ? `${this.words.uncertain}. A repeat with the same Idempotency-Key answers 409 ${FAILURE_CODES.outcomeUnknown[this.profile]}; check with the provider before sending it again under a new key`
      : `${this.words.uncertain}; check with the provider before sending it again (send an Idempotency-Key to make repeats safe)`;
    this.logger.warn(
      { client: exchange.clientId, code: error.code, err: error.message },
      `${noun} outcome unknown: sent, but no complete answer`,
    );
    const failure: ForwardingFailure =
      error.code === ProviderErrorCode.Timeout
        ? 'timeout'
        : error.code === ProviderErrorCode.MalformedResponse
          ? 'badResponse'
          : 'unreachable';
    const when = failure === 'badResponse' ? '' : ` after the ${noun} was sent`;
    throw this.fail(failure, `${error.message}${when}: ${advice}`, { cause: error });
  }

  private fail(failure: ForwardingFailure, message: string, options?: BrokerExceptionOptions) {
    return forwardingProblem(this.profile, failure, message, options);
  }
}

/** Carries the caller's problem out of `send`. */
class TokenRejected extends Error {
  constructor(readonly problem: Error) {
    super(problem.message);
  }
}

function isUnauthorized(outcome: ForwardedAnswer | ApiFailure): outcome is ForwardedAnswer {
  return outcome.kind === 'answered' && outcome.status === 401;
}

/** Lets go of a 401 answer that will not be relayed. */
function discard(answer: ForwardedAnswer): void {
  if (!Buffer.isBuffer(answer.body)) answer.body.resume();
}

/** How much of a streamed answer is read before its status is relayed, to screen it whole. */
const SCREEN_BEFORE_RELAY_BYTES = 64 * 1024;

/**
 * `'echoed'` when what would be relayed contains a token sent for this exchange; a token found
 * after relaying has begun cuts the body off and calls `onLateEcho`.
 */
async function screened(
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
  let result;
  try {
    result = await screenStream(answer.body, tokens, SCREEN_BEFORE_RELAY_BYTES, onLateEcho);
  } catch (cause) {
    return readFailed(cause);
  }
  return 'echoed' in result ? 'echoed' : { ...answer, body: result.body };
}

/** An answer whose body failed while being read: it may have been acted on, so never resent. */
export function readFailed(cause: unknown) {
  return {
    kind: 'failed',
    delivered: 'maybe',
    error:
      cause instanceof ProviderException
        ? cause
        : translateTransportError(cause, 'reading the provider answer'),
  } as const;
}
