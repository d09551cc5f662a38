import { createHash } from 'node:crypto';

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
 * Whether the configured lead is cut to half the lifetime ({@link refreshLeadMs}): the fleet then
 * asks the provider every half lifetime, twice the requests the setting suggests.
 */
export function leadCappedByLifetime(refreshAheadMs: number, lifetimeMs: number): boolean {
  return refreshAheadMs > lifetimeMs / 2;
}

/**
 * A client's place in its refresh window, in [0, 1): from a hash of its id, so every replica
 * agrees, a restart keeps it, and N clients obtained at one instant (a start, a fleet-wide
 * revoke) refresh evenly over the window instead of repeating that burst every lifetime.
 */
export function clientPhase(clientId: string): number {
  return createHash('sha256').update(clientId).digest().readUIntBE(0, 6) / 2 ** 48;
}

/** A timer may fire a millisecond before its time (rounding); the token is due by then. */
const DUE_EARLY_MS = 50;

/**
 * How far before `expiresAt - lead` the clients' refreshes are spread: the lead itself, so N
 * clients obtained at one instant refresh at N / lead a second, the even share of the refresh
 * window; at most half the token's period (lifetime less lead), so no token is refreshed before
 * half of it is used.
 */
export function spreadWidthMs(lead: number, periodMs: number): number {
  return Math.max(0, Math.min(lead, periodMs / 2));
}

/**
 * The client refreshes at the last instant at or before `expiresAt - lead` that sits at its
 * phase of a grid one spread wide, in absolute time: every lifetime lands on the same phase, so
 * the spread holds lifetime after lifetime (a token is refreshed between one and two leads
 * before it expires), and every replica's timer agrees to within the replicas' clocks (no
 * per-replica jitter, which made the earliest replica decide and narrowed the spread). One
 * replica wins the lock; the others find the new token stored.
 */
export function refreshAt(
  refreshAheadMs: number,
  obtainedAt: number,
  expiresAt: number,
  phase: number,
): number {
  const lead = refreshLeadMs(refreshAheadMs, obtainedAt, expiresAt);
  const latest = expiresAt - lead;
  // Whole milliseconds, so a token obtained at its grid point finds that point again.
  const width = Math.floor(spreadWidthMs(lead, latest - obtainedAt));
  const end = Math.floor(latest);
  return width > 0 ? end - mod(end - Math.floor(phase * width), width) : end;
}

/**
 * The shortest time from obtaining a token to its {@link refreshAt}, over every phase and every
 * instant it is obtained at: lifetime less lead less one spread width. A token obtained on its
 * client's grid point lives lifetime less lead; one obtained off it (a replica refreshing alone
 * while Redis is away, a forced refresh) is refreshed up to one width sooner, once.
 */
export function shortestRefreshMs(refreshAheadMs: number, lifetimeMs: number): number {
  const lead = refreshLeadMs(refreshAheadMs, 0, lifetimeMs);
  return lifetimeMs - lead - Math.floor(spreadWidthMs(lead, lifetimeMs - lead));
}

function mod(a: number, n: number): number {
  return ((a % n) + n) % n;
}

/** Its refresh time (or this replica's timer for it) has come. */
export function isDue(
  refreshAheadMs: number,
  record: { obtainedAt: number; expiresAt: number },
  phase: number,
  now: number,
): boolean {
  const at = refreshAt(refreshAheadMs, record.obtainedAt, record.expiresAt, phase);
  return now >= at - DUE_EARLY_MS;
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
