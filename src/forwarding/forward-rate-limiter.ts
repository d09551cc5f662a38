export type RateLimitScope = 'client' | 'caller';

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
