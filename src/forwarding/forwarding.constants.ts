/** Injection token for the {@link IdempotencyStore} (Redis when one is configured, else memory). */
export const IDEMPOTENCY_STORE = 'TOKEN_BROKER:ORDERS:IDEMPOTENCY_STORE';
/** Injection token for the {@link ForwardRateLimiter} (Redis across the fleet, or memory). */
export const FORWARD_RATE_LIMITER = 'TOKEN_BROKER:FORWARD_RATE_LIMITER';
/** Injection token for the `POST /orders` {@link ForwardRateLimiter}: its own settings and counters. */
export const ORDERS_RATE_LIMITER = 'TOKEN_BROKER:ORDERS:RATE_LIMITER';
