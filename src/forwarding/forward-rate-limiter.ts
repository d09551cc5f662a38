/** Which limit refused a request. */
export type RateLimitScope = 'client' | 'caller';

/** The verdict on one request. */
export type RateLimitVerdict =
  | {
      readonly allowed: true;
      /** Counted in process memory because Redis could not be reached (a per-replica limit). */
      readonly degraded: boolean;
    }
  | {
      readonly allowed: false;
      readonly degraded: boolean;
      /** The limit that refused it. */
      readonly scope: RateLimitScope;
      /** When the next request may pass, in milliseconds. */
      readonly retryAfterMs: number;
    };

/**
 * The passthrough's rate limits: requests per second with a burst, per client and per
 * (client, caller). Fleet-wide through Redis, so N replicas do not allow N times the rate;
 * in process memory without Redis, and while Redis is unreachable (it never fails a call).
 * Implemented by the shared-store adapter (`src/redis/forward-rate-limiter.redis.ts`).
 */
export interface ForwardRateLimiter {
  /** Counts one request of `caller` for `clientId`, or refuses it. Never throws. */
  consume(clientId: string, caller: string): Promise<RateLimitVerdict>;
}
