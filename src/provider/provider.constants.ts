/** Injection token for the shared undici `Agent` (keep-alive pool to the provider). */
export const PROVIDER_AGENT = 'TOKEN_BROKER:PROVIDER_AGENT';
/** Injection token for the {@link TokenGrantor} (the provider's token endpoint). */
export const TOKEN_GRANTOR = 'TOKEN_BROKER:TOKEN_GRANTOR';
