/** Injection token for the {@link SecretReader} adapter. */
export const SECRET_READER = 'TOKEN_BROKER:SECRET_READER';
