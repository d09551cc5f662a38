/** Injection token for the {@link IdempotencyStore} (Redis with `REDIS_URL`, else memory). */
export const IDEMPOTENCY_STORE = 'TOKEN_BROKER:ORDERS:IDEMPOTENCY_STORE';

/** Injection token for the {@link CheckoutGateway} (the provider's checkout API adapter). */
export const CHECKOUT_GATEWAY = 'TOKEN_BROKER:ORDERS:CHECKOUT_GATEWAY';
