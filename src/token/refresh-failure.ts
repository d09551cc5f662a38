/** What a failed refresh means, as pure functions; the state machine only records the verdict. */
import type { ClientConfig } from '../config/client.schema';
import { describeCredentialsSource } from '../config/secret-reference';
import type { RefreshResult } from '../metrics/metrics.service';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { SecretsException } from '../secrets/secrets.exception';
import {
  MIN_SERVE_MS,
  neededLifetimeMs,
  retryAfterSeconds,
  retryDelayMs,
} from './refresh-schedule';
import { TokenErrorCode, TokenException } from './token.exception';

interface RefreshFailure {
  /** The caller-facing exception when an operator must act. */
  permanent?: TokenException;
  result: RefreshResult;
  delayMs: number;
}

/** Times are epoch milliseconds. */
interface FailureContext {
  client: ClientConfig;
  /** Consecutive failures, this one included (1-based). */
  attempt: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  now: number;
  /** Expiry of the token still served: retries speed up as it nears. */
  servingUntil?: number;
  random: () => number;
}

export function judgeFailure(err: unknown, ctx: FailureContext): RefreshFailure {
  const permanent = permanentFailure(err, ctx.client, ctx.backoffMaxMs);
  const result: RefreshResult = permanent
    ? err instanceof SecretsException
      ? 'credentials_error'
      : 'permanent_error'
    : 'transient_error';
  const retryAfterMs = err instanceof ProviderException ? err.details.retryAfterMs : undefined;
  const delayMs = retryDelayMs({
    attempt: ctx.attempt,
    baseMs: ctx.backoffBaseMs,
    maxMs: ctx.backoffMaxMs,
    now: ctx.now,
    // An operator has to act on a permanent failure: probe slowly until they do.
    expiresAt: permanent ? undefined : ctx.servingUntil,
    retryAfterMs: permanent ? ctx.backoffMaxMs : retryAfterMs,
    random: ctx.random,
  });
  return { permanent, result, delayMs };
}

/**
 * The provider's trouble (429, 5xx, timeouts) is the same for every replica: one attempt per
 * window is enough. Credential failures stay per replica: each reads its own secret.
 */
export function isFleetWide(err: unknown): boolean {
  return err instanceof ProviderException && err.transient;
}

const OPERATORS_KNOW =
  "check the secret named in the broker's log or its readiness report on the admin port; quote the request id";

export function permanentFailure(
  err: unknown,
  client: ClientConfig,
  backoffMaxMs: number,
): TokenException | undefined {
  const permanent = (code: TokenErrorCode, message: string, operatorDetail: string) =>
    new TokenException(code, message, {
      retryAfterSeconds: Math.ceil(backoffMaxMs / 1000),
      cause: err,
      operatorDetail,
    });
  if (err instanceof ProviderException && !err.transient) {
    if (err.code !== ProviderErrorCode.InvalidClient) {
      return permanent(TokenErrorCode.Unavailable, err.message, err.message);
    }
    return permanent(
      TokenErrorCode.CredentialsRejected,
      `${err.message}; ${OPERATORS_KNOW}`,
      // The credentials' source (a reference, never the value) is what the operator fixes.
      `${err.message}; they were read from ${describeCredentialsSource(client.credentials)}`,
    );
  }
  if (err instanceof SecretsException && !err.transient) {
    return permanent(
      TokenErrorCode.CredentialsUnavailable,
      `cannot load the credentials for client "${client.id}" (${err.code}); ${OPERATORS_KNOW}`,
      `cannot load the credentials for client "${client.id}": ${err.message}`,
    );
  }
  return undefined;
}

/** A 503 whose `Retry-After` points at the next attempt. */
export function unavailableError(opts: {
  clientId: string;
  lastError?: Error;
  nextAttemptAt?: number;
  now: number;
}): TokenException {
  const retryAfter =
    opts.nextAttemptAt !== undefined ? retryAfterSeconds(opts.nextAttemptAt - opts.now) : 1;
  const message = `no token with the requested remaining lifetime could be obtained in time for client "${opts.clientId}"`;
  const last = opts.lastError;
  // A secret's message names its ARN or file path: the caller hears its code only.
  const told =
    last instanceof SecretsException
      ? `the credentials could not be read, ${last.code}`
      : last?.message;
  return new TokenException(
    TokenErrorCode.Unavailable,
    told !== undefined ? `${message} (last error: ${told})` : message,
    {
      retryAfterSeconds: retryAfter,
      operatorDetail: last !== undefined ? `${message} (last error: ${last.message})` : message,
    },
  );
}

/** A caller even a brand-new token cannot satisfy (its `min_ttl`, or the minimum to serve). */
export function lifetimeTooShort(
  clientId: string,
  lifetimeMs: number,
  requestedMs = 0,
  retryAfterSeconds?: number,
): TokenException {
  const lives = `the provider's tokens live ${seconds(lifetimeMs)} s`;
  return new TokenException(
    TokenErrorCode.Unavailable,
    requestedMs > 0
      ? `client "${clientId}": ${lives}, less than the requested min_ttl of ${seconds(requestedMs)} s; ask for less`
      : `client "${clientId}": ${lives}, too short to hand out with the minimum of ${seconds(MIN_SERVE_MS)} s left`,
    { retryAfterSeconds },
  );
}

export function lifetimeProblem(
  clientId: string,
  lifetimeMs: number,
  minRefreshIntervalMs: number,
): string {
  return `client "${clientId}": the provider's tokens live ${seconds(lifetimeMs)} s, less than the ${seconds(neededLifetimeMs(minRefreshIntervalMs))} s the broker needs to serve and refresh them (TOKEN_MIN_REFRESH_INTERVAL_MS ${seconds(minRefreshIntervalMs)} s between tokens, plus ${seconds(MIN_SERVE_MS)} s left when served)`;
}

/** A caller cannot make the broker ask the provider more often than once per interval. */
export function refreshFloorHeld(opts: {
  clientId: string;
  requestedMs: number;
  minRefreshIntervalMs: number;
  retryAfterMs: number;
}): TokenException {
  const need =
    opts.requestedMs > 0
      ? `a token with the requested min_ttl of ${seconds(opts.requestedMs)} s needs a new one`
      : 'a new token is needed';
  return new TokenException(
    TokenErrorCode.Unavailable,
    `client "${opts.clientId}": ${need}, and the broker asks the provider at most once every ${seconds(opts.minRefreshIntervalMs)} s (TOKEN_MIN_REFRESH_INTERVAL_MS); retry later or ask a smaller min_ttl`,
    { retryAfterSeconds: retryAfterSeconds(opts.retryAfterMs) },
  );
}

/** Under 10 s with one decimal: a 1.5 s lifetime is not "2 s". */
function seconds(ms: number): string {
  const s = ms / 1000;
  return s < 10 && !Number.isInteger(s) ? s.toFixed(1).replace(/\.0$/, '') : String(Math.round(s));
}
