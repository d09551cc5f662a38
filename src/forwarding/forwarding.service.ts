import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { BrokerConfig } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import {
  type ApiFailure,
  asksForNonce,
  type ProviderApiGateway,
} from '../provider/provider-api.client';
import { ProviderErrorCode } from '../provider/provider.exception';
import type { TokenRecord } from '../token/token-record';
import { TokenException } from '../token/token.exception';
import type { TokenService } from '../token/token.service';
import { collected, type ForwardedAnswer, passed, screened } from './forwarded-answer';
import type { ForwardTarget } from './forward-target';
import {
  FAILURE_CODES,
  ForwardingException,
  type ForwardingFailure,
  forwardingProblem,
  type ForwardingProfile,
} from './forwarding.exception';
import { PROFILES } from './forwarding.profiles';
import { IdempotencyClaims, type Ledger, NO_LEDGER } from './idempotency-claims';
import type { IdempotencyStore } from './idempotency-store';
import type { OrderHeaders } from './order-request';
import { bodyMarks, evidenceRule, headersRefuseToken } from './token-rejection';

export interface ForwardCall {
  readonly profile: ForwardingProfile;
  readonly client: ClientConfig;
  /** Its `Idempotency-Key`s are its own. */
  readonly caller: string;
  readonly method: string;
  readonly target: ForwardTarget;
  readonly headers: OrderHeaders;
  /** Further headers the provider sees besides `headers`. */
  readonly passed: Readonly<Record<string, string>>;
  readonly body?: Buffer;
}

/** Its body streams unless it was collected for an `Idempotency-Key` or replayed. */
export type ForwardReply = Omit<ForwardedAnswer, 'kind'> & { readonly replayed: boolean };

/** For the route's audit line: never holds a secret. */
export interface ForwardingAudit {
  tokenFingerprint?: string;
  idempotencyKeyHash?: string;
  /** Provider calls made: 0 (replayed or refused), 1, or 2 (after a 401). */
  attempts: number;
}

/** A request must leave with a token that outlives the trip to the provider. */
const TOKEN_MIN_REMAINING_MS = 2000;

const KEYED_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
const SAFE_METHODS = new Set(['GET', 'HEAD']);

/**
 * Never repeats a request that may have reached the provider; the one retry follows a 401 that
 * says the token was refused, which the provider answers before looking at the request. The
 * refused token is invalidated fenced and within bounds, so neither a storm of 401s across the
 * fleet nor one caller's 401s cost more than one token request per rejection floor. No Nest import, so it is
 * unit tested without the framework.
 */
export class ForwardingService {
  private readonly claims: IdempotencyClaims;

  constructor(
    private readonly tokens: Pick<TokenService, 'getForwardToken' | 'replaceRejected'>,
    private readonly api: ProviderApiGateway,
    store: IdempotencyStore,
    private readonly config: Pick<BrokerConfig, 'orders' | 'token' | 'forward'>,
    private readonly metrics: Pick<
      MetricsService,
      'providerLatency' | 'idempotentReplays' | 'upstreamTokenEchoes' | 'tokenRejections'
    >,
    private readonly logger: Logger,
  ) {
    this.claims = new IdempotencyClaims(store, config, metrics, logger);
  }

  async forward(call: ForwardCall, audit: ForwardingAudit): Promise<ForwardReply> {
    const key = KEYED_METHODS.has(call.method) ? call.headers.idempotencyKey : undefined;
    const withKey = key !== undefined;
    let ledger = NO_LEDGER;
    if (withKey) {
      const { keyHash, bodyHash } = PROFILES[call.profile].identity(call, key);
      audit.idempotencyKeyHash = keyHash.slice(0, 16);
      const ref = { clientId: call.client.id, caller: call.caller, keyHash };
      const claim = await this.claims.claim(call.profile, ref, bodyHash);
      if ('replay' in claim) {
        const { status, contentType, body } = claim.replay;
        const headers: Record<string, string> =
          contentType === undefined ? {} : { 'content-type': contentType };
        return { status, headers, body, replayed: true };
      }
      ledger = claim.ledger;
    }
    let outcome: ForwardedAnswer | ApiFailure;
    const sent: string[] = [];
    try {
      outcome = await this.send(call, withKey, audit, sent);
    } catch (err) {
      // No token, or every token refused with 401: nothing reached the provider that it
      // accepted, so the key may be used again. Anything unexpected errs on the safe side.
      const refused =
        err instanceof TokenException ||
        (err instanceof ForwardingException &&
          err.code === FAILURE_CODES.tokenRejected[call.profile]);
      await ledger({ state: refused ? 'released' : 'unknown' });
      throw err;
    }
    if (outcome.kind === 'answered') {
      outcome = await this.screen(call, outcome, sent, ledger, withKey);
    }
    const answer = await this.conclude(call, outcome, ledger, withKey);
    return { ...answer, replayed: false };
  }

  /** Withholds an answer that contains a token sent for this call. */
  private async screen(
    call: ForwardCall,
    answer: ForwardedAnswer,
    sent: readonly string[],
    ledger: Ledger,
    withKey: boolean,
  ): Promise<ForwardedAnswer | ApiFailure> {
    const { status } = answer;
    const limit = PROFILES[call.profile].settings(this.config).response;
    const checked = await screened(answer, sent, limit, () => this.echoed(call, status, true));
    if (checked !== 'echoed') return checked;
    this.echoed(call, status, false);
    // Processed, or refused: the provider answered, and only a 429 certainly did nothing.
    await ledger({ state: status === 429 ? 'released' : 'unknown' });
    const repeat =
      !withKey || status === 429
        ? ''
        : ` A repeat with the same Idempotency-Key answers 409 ${FAILURE_CODES.outcomeUnknown[call.profile]}.`;
    throw forwardingProblem(
      call.profile,
      'echoedToken',
      `the provider answered HTTP ${status} with an answer that contains the access token the broker sent it, so the answer is withheld (neither relayed nor stored); the ${PROFILES[call.profile].noun} may have been processed.${repeat} Check with the provider, and have the provider endpoint fixed so that it does not echo the Authorization header`,
    );
  }

  private echoed({ client, profile }: ForwardCall, status: number, late: boolean): void {
    this.metrics.upstreamTokenEchoes.labels(client.id, profile).inc();
    this.logger.error(
      { client: client.id, status, call: profile },
      late
        ? 'provider answer contained the access token after relaying had begun: cut off'
        : 'provider answer contained the access token: withheld, answered 502',
    );
  }

  /**
   * A 401 that says the token was refused is evidence, not a verdict: the token is invalidated
   * (fenced, within the fleet's rejection floor and this caller's budget) and the call sent once
   * more with its replacement. Past those bounds, or without such evidence, the 401 is relayed
   * as it is and nothing is resent: the request may have reached the provider.
   */
  private async send(
    call: ForwardCall,
    withKey: boolean,
    audit: ForwardingAudit,
    sent: string[],
  ): Promise<ForwardedAnswer | ApiFailure> {
    const clientId = call.client.id;
    const rejections = this.metrics.tokenRejections;
    // The first token, then once more with a fresh one after a refusal.
    for (let tries = 0; tries < 2; tries++) {
      const token = await this.tokens.getForwardToken(clientId, TOKEN_MIN_REMAINING_MS);
      sent.push(token.accessToken);
      audit.attempts++;
      audit.tokenFingerprint = token.fingerprint;
      const started = performance.now();
      const called = await this.callProvider(call, token, withKey);
      let outcome = called.outcome;
      const statusClass =
        outcome.kind === 'answered' ? `${Math.floor(outcome.status / 100)}xx` : 'none';
      this.metrics.providerLatency
        .labels(call.profile, statusClass)
        .observe((performance.now() - started) / 1000);
      if (outcome.kind !== 'answered' || outcome.status !== 401) return outcome;
      let refused = called.refusedToken;
      const marker = call.client.tokenRejection.bodyMarker;
      if (!refused && marker !== undefined) {
        const read = await bodyMarks(outcome, marker);
        outcome = read.answer;
        refused = read.marked;
      }
      if (!refused) {
        rejections.labels(clientId, call.profile, 'not_evidence').inc();
        return outcome;
      }
      // Fenced: a no-op when another request (or replica) already replaced this token.
      const verdict = await this.tokens.replaceRejected(clientId, token.fingerprint, call.caller);
      rejections.labels(clientId, call.profile, verdict).inc();
      // Bounded: the 401 goes back as it is. After the retry, the broker gives up either way.
      if (tries === 0 && (verdict === 'floored' || verdict === 'caller_budget')) {
        this.logger.warn(
          {
            client: clientId,
            caller: call.caller,
            call: call.profile,
            fingerprint: token.fingerprint,
            verdict,
          },
          verdict === 'floored'
            ? 'provider refused the token again within TOKEN_MIN_REJECTION_INTERVAL_MS of the last invalidation: 401 relayed, token kept'
            : "the caller's calls caused TOKEN_REJECTIONS_PER_CALLER invalidations within TOKEN_REJECTION_WINDOW_SECONDS: 401 relayed, token kept",
        );
        return outcome;
      }
      // Lets go of a 401 answer that will not be relayed.
      if (!Buffer.isBuffer(outcome.body)) outcome.body.resume();
    }
    throw forwardingProblem(
      call.profile,
      'tokenRejected',
      `the provider refused a freshly obtained token for client "${clientId}" too (HTTP 401); no ${PROFILES[call.profile].noun} was created. Check that the merchant's credentials are enabled for this API in this environment`,
    );
  }

  /** Never throws for a transport failure; a collected (keyed) answer has a Buffer body. */
  private async callProvider(
    call: ForwardCall,
    token: TokenRecord,
    withKey: boolean,
  ): Promise<{ outcome: ForwardedAnswer | ApiFailure; refusedToken: boolean }> {
    const { client, method, target } = call;
    const profile = PROFILES[call.profile];
    const settings = profile.settings(this.config);
    const send = () =>
      this.api.call({
        client,
        accessToken: token.accessToken,
        method,
        target: `${target.path}${target.query}`,
        headers: { ...call.passed, ...call.headers.forward },
        body: call.body,
        ...settings.response,
      });
    let outcome = await send();
    // Refused before a byte was written: a GET or HEAD may go once more (never a POST).
    if (outcome.kind === 'failed' && outcome.delivered === 'no' && SAFE_METHODS.has(method)) {
      outcome = await send();
    }
    // Judged on the provider's own headers: WWW-Authenticate is not returned to the caller. A
    // DPoP nonce challenge (left after the adapter's one retry) is about the proof, not the token.
    const refusedToken =
      outcome.kind === 'answered' &&
      outcome.status === 401 &&
      !asksForNonce(outcome.headers) &&
      (evidenceRule(client, call.profile) === 'any' || headersRefuseToken(outcome.headers));
    return {
      outcome: withKey
        ? await collected(outcome, settings.maxStoredBytes, profile.returned, settings.response)
        : await passed(outcome, profile.returned, settings.response),
      refusedToken,
    };
  }

  private async conclude(
    call: ForwardCall,
    outcome: ForwardedAnswer | ApiFailure,
    ledger: Ledger,
    withKey: boolean,
  ): Promise<ForwardedAnswer> {
    const { noun, uncertain } = PROFILES[call.profile];
    if (outcome.kind === 'answered') {
      // 429: rate limited, 401: not authorised; both refused before processing, so a retry
      // under the same key is safe (and replaying a stale refusal for a day would block it).
      if (outcome.status === 429 || outcome.status === 401) await ledger({ state: 'released' });
      else if (withKey) {
        const { status, headers, body } = outcome;
        const response = { status, contentType: headers['content-type'], body: body as Buffer };
        await ledger({ state: 'completed', response });
      }
      return outcome;
    }
    const { error } = outcome;
    if (outcome.delivered === 'no') {
      await ledger({ state: 'released' });
      throw forwardingProblem(
        call.profile,
        'unreachable',
        `${error.message}; the ${noun} was not sent, so it is safe to retry`,
        { retryAfterSeconds: 2, cause: error },
      );
    }
    await ledger({ state: 'unknown' });
    const advice = withKey
      ? `${uncertain}. A repeat with the same Idempotency-Key answers 409 ${FAILURE_CODES.outcomeUnknown[call.profile]}; check with the provider before sending it again under a new key`
      : `${uncertain}; check with the provider before sending it again (send an Idempotency-Key to make repeats safe)`;
    this.logger.warn(
      { client: call.client.id, code: error.code, err: error.message },
      `${noun} outcome unknown: sent, but no complete answer`,
    );
    const failure: ForwardingFailure =
      error.code === ProviderErrorCode.Timeout
        ? 'timeout'
        : error.code === ProviderErrorCode.MalformedResponse
          ? 'badResponse'
          : 'unreachable';
    const when = failure === 'badResponse' ? '' : ` after the ${noun} was sent`;
    throw forwardingProblem(call.profile, failure, `${error.message}${when}: ${advice}`, {
      cause: error,
    });
  }
}
