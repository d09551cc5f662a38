/** Injection token for the shared undici `Agent` (keep-alive pool to the provider). Internal to the provider module. */
export const PROVIDER_AGENT = 'TOKEN_BROKER:PROVIDER_AGENT';
/** Injection token for the {@link TokenGrantor} (the provider's token endpoint). */
export const TOKEN_GRANTOR = 'TOKEN_BROKER:TOKEN_GRANTOR';
/** Injection token for the {@link ProviderApiClient} (any call under `{base_url}`: orders and the passthrough). */
export const PROVIDER_API_GATEWAY = 'TOKEN_BROKER:PROVIDER_API_GATEWAY';
/** The checkout API's keep-alive pool, shared by orders and the passthrough. Internal to the provider module. */
export const CHECKOUT_AGENT = 'TOKEN_BROKER:CHECKOUT_AGENT';
/** The standard (RFC 6749) token client, which owns the mutual-TLS pools. Internal to the provider module. */
export const STANDARD_TOKEN_CLIENT = 'TOKEN_BROKER:STANDARD_TOKEN_CLIENT';
