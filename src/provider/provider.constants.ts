/** Injection token for the {@link TokenGrantor} (the provider's token endpoint). */
export const TOKEN_GRANTOR = 'TOKEN_BROKER:TOKEN_GRANTOR';
/** Injection token for the {@link ProviderApiClient} (any call under `{base_url}`: orders and the passthrough). */
export const PROVIDER_API_GATEWAY = 'TOKEN_BROKER:PROVIDER_API_GATEWAY';
/**
 * Injection token for the {@link ProviderMetadataCache}: each `tokenRequest.issuer`'s RFC 8414
 * metadata (token endpoint, mTLS aliases, auth methods, `dpopSigningAlgs`).
 */
export const PROVIDER_METADATA = 'TOKEN_BROKER:PROVIDER_METADATA';
