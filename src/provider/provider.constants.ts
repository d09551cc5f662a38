/** Injection token for the {@link TokenGrantor} (the provider's token endpoint). */
export const TOKEN_GRANTOR = 'TOKEN_BROKER:TOKEN_GRANTOR';
/** Injection token for the {@link ProviderApiClient} (any call under `{base_url}`: orders and the passthrough). */
export const PROVIDER_API_GATEWAY = 'TOKEN_BROKER:PROVIDER_API_GATEWAY';
