/** Injection token for the {@link ForwardRateLimiter} (Redis across the fleet, or memory). */
export const FORWARD_RATE_LIMITER = 'TOKEN_BROKER:FORWARD_RATE_LIMITER';
