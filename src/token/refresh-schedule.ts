/**
 * Pure timing rules of the token lifecycle, kept apart from the state machine so they can be
 * unit-tested exactly. All times are epoch milliseconds.
 */

/** Never hand out a token with less than this left: it could expire on the wire. */
export const MIN_SERVE_MS = 1000;

/** The longest delay `setTimeout` honours (2^31-1 ms); a longer one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The shortest provider lifetime the broker can serve without gaps: a token must outlive the
 * fleet's refresh floor (no new token before it) and still have {@link MIN_SERVE_MS} left.
 */
export function neededLifetimeMs(minRefreshIntervalMs: number): number {
  return minRefreshIntervalMs + MIN_SERVE_MS;
}

/**
 * How long before expiry to refresh: the configured lead, but never more than half the
 * token's lifetime, so a provider that issues short tokens does not cause a refresh loop.
 */
export function refreshLeadMs(
  refreshAheadMs: number,
  obtainedAt: number,
  expiresAt: number,
): number {
  return Math.min(refreshAheadMs, Math.max(0, (expiresAt - obtainedAt) / 2));
}

/**
 * When this replica should try to refresh. Each replica subtracts its own random jitter (up
 * to a quarter of the lead, at most 30 s) so the fleet does not hit the lock at one instant;
 * the earliest wins it and the others find the new token already stored.
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

/**
 * Whether a token is inside its refresh window: some replica's timer (lead plus the largest
 * jitter) may already have fired for it. A token outside the window needs no refresh.
 */
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
 * Delay before retry number `attempt` (1-based) after a failed refresh: capped exponential
 * backoff with full jitter. The cap shrinks as expiry nears (a quarter of the remaining
 * lifetime) so the last valid minutes still see several attempts, yet the total stays bounded.
 */
export function retryDelayMs(opts: {
  attempt: number;
  baseMs: number;
  maxMs: number;
  now: number;
  /** Expiry of the token still being served, if any. */
  expiresAt?: number;
  /**
   * The provider's `Retry-After`, honoured (up to `maxMs`) even past the token's expiry: the
   * provider refuses any request before then, so a "last chance" inside it is only one more
   * refusal, and this delay becomes the whole fleet's deferral.
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
