import type { ForwardingProfile } from './forwarding.exception';

export type RateLimitScope = 'client' | 'caller';

/** Each route has its own limits and counters. */
export type RateLimitedRoute = ForwardingProfile;

export type RateLimitVerdict = {
  /** Counted in process memory because Redis could not be reached: a per-replica limit. */
  readonly degraded: boolean;
} & (
  | { readonly allowed: true }
  | { readonly allowed: false; readonly scope: RateLimitScope; readonly retryAfterMs: number }
);

/**
 * Per client and per (client, caller). Fleet-wide through Redis, so N replicas do not allow N
 * times the rate; in process memory while Redis is unreachable, so it never fails a call.
 */
export interface ForwardRateLimiter {
  /** Never throws. */
  consume(clientId: string, caller: string): Promise<RateLimitVerdict>;
}
