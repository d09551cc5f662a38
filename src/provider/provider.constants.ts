/** Injection token for the shared undici `Agent` (keep-alive pool to the provider). Internal to the provider module. */
export const PROVIDER_AGENT = 'TOKEN_BROKER:PROVIDER_AGENT';
/** Injection token for the {@link TokenGrantor} (the provider's token endpoint). */
export const TOKEN_GRANTOR = 'TOKEN_BROKER:TOKEN_GRANTOR';
/** Injection token for the {@link CheckoutGateway} (the provider's checkout API). */
export const CHECKOUT_GATEWAY = 'TOKEN_BROKER:CHECKOUT_GATEWAY';
