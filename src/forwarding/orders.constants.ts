/** Injection token for the {@link IdempotencyStore} (Redis with `REDIS_URL`, else memory). */
export const IDEMPOTENCY_STORE = 'TOKEN_BROKER:ORDERS:IDEMPOTENCY_STORE';
