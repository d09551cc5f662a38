/**
 * What a failed refresh means, as pure functions: whether it needs an operator, how it is
 * counted, how long to wait before the next attempt, and what a caller still waiting is told.
 * The state machine ({@link ClientTokenManager}) only records the verdict.
 */
import type { ClientConfig } from '../config/client.schema';
import type { RefreshResult } from '../metrics/metrics.service';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { SecretsException } from '../secrets/secrets.exception';
import { MIN_SERVE_MS, neededLifetimeMs, retryDelayMs } from './refresh-schedule';
import { TokenErrorCode, TokenException } from './token.exception';

/** The verdict on one failed refresh pass. */
export interface RefreshFailure {
  /** The caller-facing exception when an operator must act (credentials refused or unreadable). */
  permanent?: TokenException;
  /** The `refreshes` metric label. */
  result: RefreshResult;
  /** How long to wait before the next pass (ms). */
  delayMs: number;
}

/** Inputs of {@link judgeFailure}. Times are epoch milliseconds. */
export interface FailureContext {
  client: ClientConfig;
  /** 1-based number of consecutive failures, this one included. */
  attempt: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  now: number;
  /** Expiry of the token still being served, if any: retries speed up as it nears. */
  servingUntil?: number;
  random: () => number;
}

/** Classifies `err` and picks the delay before the next pass. */
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
    // An operator has to act on a permanent failure: probe slowly until they do.
    maxMs: ctx.backoffMaxMs,
    now: ctx.now,
    expiresAt: permanent ? undefined : ctx.servingUntil,
    retryAfterMs: permanent ? ctx.backoffMaxMs : retryAfterMs,
    random: ctx.random,
  });
  return { permanent, result, delayMs };
}

/**
 * Whether the whole fleet should back off after `err`: the provider's trouble (429, 5xx,
 * timeouts, garbled answers) is the same for every replica, so one attempt per window is
 * enough. Failures an operator must fix (refused or unreadable credentials) stay per replica:
 * each replica reads its own secret and reports the problem in its own readiness.
 */
export function isFleetWide(err: unknown): boolean {
  return err instanceof ProviderException && err.transient;
}

/** Where the secret reference a caller is not told can be read. */
const OPERATORS_KNOW =
  "check the secret named in the broker's log or its readiness report on the admin port; quote the request id";

/** A permanent failure as the caller-facing exception, or undefined when transient. */
export function permanentFailure(
  err: unknown,
  client: ClientConfig,
  backoffMaxMs: number,
): TokenException | undefined {
  const retryAfterSeconds = Math.ceil(backoffMaxMs / 1000);
  if (err instanceof ProviderException && !err.transient) {
    const rejected = err.code === ProviderErrorCode.InvalidClient;
    const source = client.credentials;
    return new TokenException(
      rejected ? TokenErrorCode.CredentialsRejected : TokenErrorCode.Unavailable,
      rejected ? `${err.message}; ${OPERATORS_KNOW}` : err.message,
      {
        retryAfterSeconds,
        cause: err,
        // Where the refused credentials came from (a reference, never the value) is what the
        // operator has to fix; they were already re-read once.
        operatorDetail: rejected
          ? `${err.message}; they were read from ${source.file !== undefined ? `file "${source.file}"` : `Secrets Manager secret "${source.secretId}"`}`
          : err.message,
      },
    );
  }
  if (err instanceof SecretsException && !err.transient) {
    return new TokenException(
      TokenErrorCode.CredentialsUnavailable,
      `cannot load the credentials for client "${client.id}" (${err.code}); ${OPERATORS_KNOW}`,
      {
        retryAfterSeconds,
        cause: err,
        operatorDetail: `cannot load the credentials for client "${client.id}": ${err.message}`,
      },
    );
  }
  return undefined;
}

/**
 * What a caller whose wait ran out is told: the permanent failure if there is one, else a 503
 * whose `Retry-After` points at the next attempt and whose message quotes the last error.
 */
export function unavailableError(opts: {
  clientId: string;
  permanent?: TokenException;
  lastError?: Error;
  nextAttemptAt?: number;
  now: number;
}): TokenException {
  if (opts.permanent) return opts.permanent;
  const retryAfter =
    opts.nextAttemptAt !== undefined
      ? Math.max(1, Math.ceil((opts.nextAttemptAt - opts.now) / 1000))
      : 1;
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

/**
 * The refusal of a caller that even a brand-new token cannot satisfy. With a `min_ttl`
 * (`requestedMs` > 0) that is what it asked for; without one, the provider's lifetime is
 * shorter than what the broker needs to serve a token at all.
 */
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

/**
 * Why the broker cannot serve a provider whose tokens live `lifetimeMs`: readiness and the
 * log say it once per transition, naming the lifetime and the setting involved.
 */
export function lifetimeProblem(
  clientId: string,
  lifetimeMs: number,
  minRefreshIntervalMs: number,
): string {
  return `client "${clientId}": the provider's tokens live ${seconds(lifetimeMs)} s, less than the ${seconds(neededLifetimeMs(minRefreshIntervalMs))} s the broker needs to serve and refresh them (TOKEN_MIN_REFRESH_INTERVAL_MS ${seconds(minRefreshIntervalMs)} s between tokens, plus ${seconds(MIN_SERVE_MS)} s left when served)`;
}

/**
 * The refusal of a caller whose `min_ttl` needs a new token while the refresh floor holds:
 * a caller cannot make the broker ask the provider more often than once per interval.
 */
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
    { retryAfterSeconds: Math.max(1, Math.ceil(opts.retryAfterMs / 1000)) },
  );
}

/** Whole seconds for messages; under 10 s with one decimal (a 1.5 s lifetime is not "2 s"). */
function seconds(ms: number): string {
  const s = ms / 1000;
  return s < 10 && !Number.isInteger(s) ? s.toFixed(1).replace(/\.0$/, '') : String(Math.round(s));
}
