/** Timing rules as pure functions, so they can be unit-tested exactly (epoch ms). */

/** Never hand out a token with less than this left: it could expire on the wire. */
export const MIN_SERVE_MS = 1000;

/** `setTimeout` fires at once on a longer delay. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** A `Retry-After` in whole seconds: rounded up, and at least 1 so a caller never spins. */
export function retryAfterSeconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** A token must outlive the fleet's refresh floor and still have {@link MIN_SERVE_MS} left. */
export function neededLifetimeMs(minRefreshIntervalMs: number): number {
  return minRefreshIntervalMs + MIN_SERVE_MS;
}

/** At most half the lifetime, so a provider issuing short tokens causes no refresh loop. */
export function refreshLeadMs(
  refreshAheadMs: number,
  obtainedAt: number,
  expiresAt: number,
): number {
  return Math.min(refreshAheadMs, Math.max(0, (expiresAt - obtainedAt) / 2));
}

/**
 * Each replica subtracts its own jitter so the fleet does not hit the lock at one instant; the
 * earliest wins it and the others find the new token already stored.
 */
export function refreshAt(
  refreshAheadMs: number,
  obtainedAt: number,
  expiresAt: number,
  random: () => number = Math.random,
): number {
  const lead = refreshLeadMs(refreshAheadMs, obtainedAt, expiresAt);
  const jitter = random() * maxJitterMs(lead);
  return expiresAt - lead - jitter;
}

function maxJitterMs(lead: number): number {
  return Math.min(lead / 4, 30_000);
}

/** Some replica's timer (lead plus the largest jitter) may already have fired for it. */
export function isDue(
  refreshAheadMs: number,
  obtainedAt: number,
  expiresAt: number,
  now: number,
): boolean {
  const lead = refreshLeadMs(refreshAheadMs, obtainedAt, expiresAt);
  return expiresAt - now <= lead + maxJitterMs(lead);
}

/**
 * Capped exponential backoff with full jitter; the cap shrinks to a quarter of the remaining
 * lifetime so the last valid minutes still see several attempts.
 */
export function retryDelayMs(opts: {
  attempt: number;
  baseMs: number;
  maxMs: number;
  now: number;
  expiresAt?: number;
  /**
   * Honoured even past the token's expiry: the provider refuses any request before then, and
   * this delay becomes the whole fleet's deferral.
   */
  retryAfterMs?: number;
  random?: () => number;
}): number {
  const random = opts.random ?? Math.random;
  const remaining = opts.expiresAt === undefined ? Infinity : opts.expiresAt - opts.now;
  const cap =
    remaining > 0 && Number.isFinite(remaining)
      ? Math.min(opts.maxMs, Math.max(opts.baseMs, remaining / 4))
      : opts.maxMs;
  const exp = Math.min(cap, opts.baseMs * 2 ** Math.min(opts.attempt - 1, 30));
  // Full jitter, with a floor so a run of tiny draws cannot turn into a hot loop.
  let delay = Math.max(Math.min(25, opts.baseMs), random() * exp);
  if (opts.retryAfterMs !== undefined)
    delay = Math.max(delay, Math.min(opts.retryAfterMs, opts.maxMs));
  return Math.round(delay);
}
