/** Injection token for the validated {@link BrokerConfig}. */
export const BROKER_CONFIG = 'TOKEN_BROKER:CONFIG';
