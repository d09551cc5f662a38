import { ENV_SETTINGS } from './config.loader';
import { brokerConfigSchema } from './config.schema';
import { envSettings, settingFields } from './setting-meta';

/**
 * The environment names are the broker's contract: deployments set them. They now come from the
 * schema's metadata, so a renamed or moved field must fail here rather than silently drop a
 * variable. Paths under `clients.[]` build the only client.
 */
const CONTRACT: ReadonlyArray<readonly [string, string]> = [
  ['PORT', 'http.port'],
  ['HOST', 'http.host'],
  ['SHUTDOWN_DRAIN_DELAY_MS', 'http.shutdownDrainDelayMs'],
  ['SHUTDOWN_GRACE_MS', 'http.shutdownGraceMs'],
  ['HTTP_HEADERS_TIMEOUT_MS', 'http.headersTimeoutMs'],
  ['HTTP_REQUEST_TIMEOUT_MS', 'http.requestTimeoutMs'],
  ['ADMIN_PORT', 'http.adminPort'],
  ['METRICS_PORT', 'http.metricsPort'],
  ['HTTP_KEEP_ALIVE_TIMEOUT_MS', 'http.keepAliveTimeoutMs'],
  ['OAUTH_ISSUER', 'http.issuer'],
  ['LOG_LEVEL', 'log.level'],
  ['AUDIT_INTERVAL_SECONDS', 'audit.intervalSeconds'],
  ['AUDIT_PER_REQUEST', 'audit.perRequest'],
  ['AUDIT_REFUSALS_PER_SECOND', 'audit.refusalsPerSecond'],
  ['REDIS_MODE', 'redis.mode'],
  ['REDIS_URL', 'redis.url'],
  ['REDIS_SENTINELS', 'redis.sentinel.nodes'],
  ['REDIS_SENTINEL_MASTER', 'redis.sentinel.masterName'],
  ['REDIS_SENTINEL_USERNAME', 'redis.sentinel.username'],
  ['REDIS_SENTINEL_PASSWORD_SECRET_ID', 'redis.sentinel.password.secretId'],
  ['REDIS_SENTINEL_PASSWORD_FILE', 'redis.sentinel.password.file'],
  ['REDIS_CLUSTER_NODES', 'redis.cluster.nodes'],
  ['REDIS_USERNAME', 'redis.username'],
  ['REDIS_PASSWORD_SECRET_ID', 'redis.password.secretId'],
  ['REDIS_PASSWORD_FILE', 'redis.password.file'],
  ['REDIS_TLS', 'redis.tls.enabled'],
  ['REDIS_TLS_CA_FILE', 'redis.tls.caFile'],
  ['REDIS_TLS_CERT_FILE', 'redis.tls.certFile'],
  ['REDIS_TLS_KEY_FILE', 'redis.tls.keyFile'],
  ['REDIS_TLS_SERVER_NAME', 'redis.tls.serverName'],
  ['REDIS_COMMAND_TIMEOUT_MS', 'redis.commandTimeoutMs'],
  ['REDIS_PING_INTERVAL_MS', 'redis.pingIntervalMs'],
  ['TOKEN_REFRESH_AHEAD_SECONDS', 'token.refreshAheadSeconds'],
  ['TOKEN_DEFAULT_LIFETIME_SECONDS', 'token.defaultLifetimeSeconds'],
  ['TOKEN_WAIT_TIMEOUT_MS', 'token.waitTimeoutMs'],
  ['TOKEN_LOCK_TTL_MS', 'token.lockTtlMs'],
  ['TOKEN_BACKOFF_BASE_MS', 'token.backoffBaseMs'],
  ['TOKEN_BACKOFF_MAX_MS', 'token.backoffMaxMs'],
  ['TOKEN_MIN_REFRESH_INTERVAL_MS', 'token.minRefreshIntervalMs'],
  ['TOKEN_MIN_REJECTION_INTERVAL_MS', 'token.minRejectionIntervalMs'],
  ['TOKEN_REJECTIONS_PER_CALLER', 'token.rejectionsPerCaller'],
  ['TOKEN_REJECTION_WINDOW_SECONDS', 'token.rejectionWindowSeconds'],
  ['CREDENTIALS_RELOAD_SECONDS', 'token.credentialsReloadSeconds'],
  ['PROVIDER_CONNECT_TIMEOUT_MS', 'provider.connectTimeoutMs'],
  ['PROVIDER_RESPONSE_TIMEOUT_MS', 'provider.responseTimeoutMs'],
  ['ORDERS_IDEMPOTENCY_TTL_SECONDS', 'orders.idempotencyTtlSeconds'],
  ['ORDERS_BODY_LIMIT_BYTES', 'orders.bodyLimitBytes'],
  ['ORDERS_CONNECT_TIMEOUT_MS', 'orders.connectTimeoutMs'],
  ['ORDERS_HEADERS_TIMEOUT_MS', 'orders.headersTimeoutMs'],
  ['ORDERS_BODY_TIMEOUT_MS', 'orders.bodyTimeoutMs'],
  ['ORDERS_MAX_RESPONSE_BYTES', 'orders.maxResponseBytes'],
  ['ORDERS_BODY_BUDGET_BYTES', 'orders.bodyBudgetBytes'],
  ['ORDERS_BODY_BUDGET_CALLER_PERCENT', 'orders.bodyBudgetCallerPercent'],
  ['ORDERS_MAX_IN_FLIGHT_PER_CALLER', 'orders.maxInFlightPerCaller'],
  ['ORDERS_CLIENT_RATE_PER_SECOND', 'orders.clientRatePerSecond'],
  ['ORDERS_CLIENT_RATE_BURST', 'orders.clientRateBurst'],
  ['ORDERS_CALLER_RATE_PER_SECOND', 'orders.callerRatePerSecond'],
  ['ORDERS_CALLER_RATE_BURST', 'orders.callerRateBurst'],
  ['ORDERS_IDEMPOTENCY_MAX_RECORDS_PER_CALLER', 'orders.maxIdempotencyRecordsPerCaller'],
  ['ORDERS_IDEMPOTENCY_MAX_BYTES_PER_CALLER', 'orders.maxIdempotencyBytesPerCaller'],
  ['FORWARD_BODY_LIMIT_BYTES', 'forward.bodyLimitBytes'],
  ['FORWARD_MAX_RESPONSE_BYTES', 'forward.maxResponseBytes'],
  ['FORWARD_MAX_STORED_RESPONSE_BYTES', 'forward.maxStoredResponseBytes'],
  ['FORWARD_IDEMPOTENCY_TTL_SECONDS', 'forward.idempotencyTtlSeconds'],
  ['FORWARD_IDEMPOTENCY_MAX_RECORDS_PER_CALLER', 'forward.maxIdempotencyRecordsPerCaller'],
  ['FORWARD_IDEMPOTENCY_MAX_BYTES_PER_CALLER', 'forward.maxIdempotencyBytesPerCaller'],
  ['FORWARD_MAX_IN_FLIGHT_PER_CALLER', 'forward.maxInFlightPerCaller'],
  ['FORWARD_CLIENT_RATE_PER_SECOND', 'forward.clientRatePerSecond'],
  ['FORWARD_CLIENT_RATE_BURST', 'forward.clientRateBurst'],
  ['FORWARD_CALLER_RATE_PER_SECOND', 'forward.callerRatePerSecond'],
  ['FORWARD_CALLER_RATE_BURST', 'forward.callerRateBurst'],
  ['CLIENT_ID', 'clients.[].id'],
  ['PROVIDER_AUTH_URL', 'clients.[].authUrl'],
  ['PROVIDER_BASE_URL', 'clients.[].baseUrl'],
  ['PROVIDER_ORDERS_PATH', 'clients.[].ordersPath'],
  ['CREDENTIALS_SECRET_ID', 'clients.[].credentials.secretId'],
  ['CREDENTIALS_FILE', 'clients.[].credentials.file'],
  ['TOKEN_REQUEST_GRANT', 'clients.[].tokenRequest.grant'],
  ['TOKEN_REQUEST_URL', 'clients.[].tokenRequest.url'],
  ['TOKEN_REQUEST_AUTH', 'clients.[].tokenRequest.auth'],
  ['TOKEN_REQUEST_SCOPE', 'clients.[].tokenRequest.scope'],
  ['TOKEN_REQUEST_AUDIENCE', 'clients.[].tokenRequest.audience'],
  ['TOKEN_REQUEST_RESOURCE', 'clients.[].tokenRequest.resource'],
  ['TOKEN_REQUEST_PARAMS', 'clients.[].tokenRequest.params'],
  ['TOKEN_REQUEST_HEADERS', 'clients.[].tokenRequest.headers'],
  ['TOKEN_REQUEST_ASSERTION_LIFETIME_SECONDS', 'clients.[].tokenRequest.assertion.lifetimeSeconds'],
  ['TOKEN_REQUEST_ASSERTION_ALG', 'clients.[].tokenRequest.assertion.alg'],
  ['TOKEN_REQUEST_ASSERTION_KID', 'clients.[].tokenRequest.assertion.kid'],
  ['NODE_ENV', 'nodeEnv'],
  ['CALLER_AUTH_MODE', 'callerAuth.mode'],
  ['CALLER_AUTH_ALLOW_NONE', 'callerAuth.allowNone'],
  ['CALLER_API_KEYS_SECRET_ID', 'callerAuth.apiKeysSource.secretId'],
  ['CALLER_API_KEYS_FILE', 'callerAuth.apiKeysSource.file'],
  ['CALLER_API_KEYS_RELOAD_SECONDS', 'callerAuth.apiKeysReloadSeconds'],
  ['CALLER_AUTH_JWKS_URL', 'callerAuth.kubernetes.jwksUrl'],
  ['CALLER_AUTH_ISSUER', 'callerAuth.kubernetes.issuer'],
  ['CALLER_AUTH_AUDIENCE', 'callerAuth.kubernetes.audience'],
  ['CALLER_AUTH_SUBJECTS', 'callerAuth.kubernetes.subjects'],
  ['CALLER_AUTH_MAX_TOKEN_LIFETIME_SECONDS', 'callerAuth.kubernetes.maxTokenLifetimeSeconds'],
  ['CACHE_KEY_SECRET_ID', 'cacheEncryption.key.secretId'],
  ['CACHE_KEY_FILE', 'cacheEncryption.key.file'],
  ['READINESS_REQUIRED_CLIENTS', 'readiness.requiredClients'],
];

describe('environment variables from the schema metadata', () => {
  const settings = envSettings(settingFields(brokerConfigSchema));

  it('are exactly the contract, each name setting one path', () => {
    expect(settings.map((s) => [s.env, s.path.join('.')])).toEqual(CONTRACT);
    expect(new Set(settings.map((s) => s.env)).size).toBe(settings.length);
  });

  it('feed the loader its table of top-level settings', () => {
    expect(ENV_SETTINGS.map((s) => s.env)).toEqual(
      CONTRACT.filter(([, path]) => !path.startsWith('clients.')).map(([env]) => env),
    );
  });
});
