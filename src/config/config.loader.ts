import { closeSync, openSync, readSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { ZodError } from 'zod';
import { ConfigErrorCode, ConfigException } from './config.exception';
import { type BrokerConfig, brokerConfigSchema } from './config.schema';
import { looksLikeSettingName, shownReference } from './secret-reference';

type Path = readonly (string | number)[];

/** The first block is the broker's fixed contract: deployments rely on these names. */
export const ENV_SETTINGS: ReadonlyArray<{ env: string; path: Path }> = [
  { env: 'PORT', path: ['http', 'port'] },
  { env: 'REDIS_URL', path: ['redis', 'url'] },
  { env: 'TOKEN_REFRESH_AHEAD_SECONDS', path: ['token', 'refreshAheadSeconds'] },
  { env: 'TOKEN_DEFAULT_LIFETIME_SECONDS', path: ['token', 'defaultLifetimeSeconds'] },
  { env: 'HOST', path: ['http', 'host'] },
  { env: 'SHUTDOWN_GRACE_MS', path: ['http', 'shutdownGraceMs'] },
  { env: 'SHUTDOWN_DRAIN_DELAY_MS', path: ['http', 'shutdownDrainDelayMs'] },
  { env: 'ADMIN_PORT', path: ['http', 'adminPort'] },
  { env: 'METRICS_PORT', path: ['http', 'metricsPort'] },
  { env: 'HTTP_HEADERS_TIMEOUT_MS', path: ['http', 'headersTimeoutMs'] },
  { env: 'HTTP_REQUEST_TIMEOUT_MS', path: ['http', 'requestTimeoutMs'] },
  { env: 'HTTP_KEEP_ALIVE_TIMEOUT_MS', path: ['http', 'keepAliveTimeoutMs'] },
  { env: 'OAUTH_ISSUER', path: ['http', 'issuer'] },
  { env: 'READINESS_REQUIRED_CLIENTS', path: ['readiness', 'requiredClients'] },
  { env: 'LOG_LEVEL', path: ['log', 'level'] },
  { env: 'AUDIT_INTERVAL_SECONDS', path: ['audit', 'intervalSeconds'] },
  { env: 'AUDIT_PER_REQUEST', path: ['audit', 'perRequest'] },
  { env: 'AUDIT_REFUSALS_PER_SECOND', path: ['audit', 'refusalsPerSecond'] },
  { env: 'REDIS_COMMAND_TIMEOUT_MS', path: ['redis', 'commandTimeoutMs'] },
  { env: 'REDIS_PING_INTERVAL_MS', path: ['redis', 'pingIntervalMs'] },
  { env: 'TOKEN_WAIT_TIMEOUT_MS', path: ['token', 'waitTimeoutMs'] },
  { env: 'TOKEN_LOCK_TTL_MS', path: ['token', 'lockTtlMs'] },
  { env: 'TOKEN_BACKOFF_BASE_MS', path: ['token', 'backoffBaseMs'] },
  { env: 'TOKEN_BACKOFF_MAX_MS', path: ['token', 'backoffMaxMs'] },
  { env: 'TOKEN_MIN_REFRESH_INTERVAL_MS', path: ['token', 'minRefreshIntervalMs'] },
  { env: 'TOKEN_MIN_REJECTION_INTERVAL_MS', path: ['token', 'minRejectionIntervalMs'] },
  { env: 'TOKEN_REJECTIONS_PER_CALLER', path: ['token', 'rejectionsPerCaller'] },
  { env: 'TOKEN_REJECTION_WINDOW_SECONDS', path: ['token', 'rejectionWindowSeconds'] },
  { env: 'TOKEN_ENDPOINT_MAX_CONCURRENCY', path: ['token', 'endpointMaxConcurrency'] },
  { env: 'TOKEN_ENDPOINT_RATE_PER_SECOND', path: ['token', 'endpointRatePerSecond'] },
  { env: 'CREDENTIALS_RELOAD_SECONDS', path: ['token', 'credentialsReloadSeconds'] },
  { env: 'PROVIDER_CONNECT_TIMEOUT_MS', path: ['provider', 'connectTimeoutMs'] },
  { env: 'PROVIDER_RESPONSE_TIMEOUT_MS', path: ['provider', 'responseTimeoutMs'] },
  { env: 'ORDERS_IDEMPOTENCY_TTL_SECONDS', path: ['orders', 'idempotencyTtlSeconds'] },
  { env: 'ORDERS_BODY_LIMIT_BYTES', path: ['orders', 'bodyLimitBytes'] },
  { env: 'ORDERS_CONNECT_TIMEOUT_MS', path: ['orders', 'connectTimeoutMs'] },
  { env: 'ORDERS_HEADERS_TIMEOUT_MS', path: ['orders', 'headersTimeoutMs'] },
  { env: 'ORDERS_BODY_TIMEOUT_MS', path: ['orders', 'bodyTimeoutMs'] },
  { env: 'ORDERS_MAX_RESPONSE_BYTES', path: ['orders', 'maxResponseBytes'] },
  { env: 'ORDERS_BODY_BUDGET_BYTES', path: ['orders', 'bodyBudgetBytes'] },
  { env: 'ORDERS_BODY_BUDGET_CALLER_PERCENT', path: ['orders', 'bodyBudgetCallerPercent'] },
  { env: 'ORDERS_MAX_IN_FLIGHT_PER_CALLER', path: ['orders', 'maxInFlightPerCaller'] },
  { env: 'ORDERS_CLIENT_RATE_PER_SECOND', path: ['orders', 'clientRatePerSecond'] },
  { env: 'ORDERS_CLIENT_RATE_BURST', path: ['orders', 'clientRateBurst'] },
  { env: 'ORDERS_CALLER_RATE_PER_SECOND', path: ['orders', 'callerRatePerSecond'] },
  { env: 'ORDERS_CALLER_RATE_BURST', path: ['orders', 'callerRateBurst'] },
  {
    env: 'ORDERS_IDEMPOTENCY_MAX_RECORDS_PER_CALLER',
    path: ['orders', 'maxIdempotencyRecordsPerCaller'],
  },
  {
    env: 'ORDERS_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
    path: ['orders', 'maxIdempotencyBytesPerCaller'],
  },
  { env: 'FORWARD_BODY_LIMIT_BYTES', path: ['forward', 'bodyLimitBytes'] },
  { env: 'FORWARD_MAX_RESPONSE_BYTES', path: ['forward', 'maxResponseBytes'] },
  { env: 'FORWARD_MAX_STORED_RESPONSE_BYTES', path: ['forward', 'maxStoredResponseBytes'] },
  { env: 'FORWARD_IDEMPOTENCY_TTL_SECONDS', path: ['forward', 'idempotencyTtlSeconds'] },
  {
    env: 'FORWARD_IDEMPOTENCY_MAX_RECORDS_PER_CALLER',
    path: ['forward', 'maxIdempotencyRecordsPerCaller'],
  },
  {
    env: 'FORWARD_IDEMPOTENCY_MAX_BYTES_PER_CALLER',
    path: ['forward', 'maxIdempotencyBytesPerCaller'],
  },
  { env: 'FORWARD_MAX_IN_FLIGHT_PER_CALLER', path: ['forward', 'maxInFlightPerCaller'] },
  { env: 'FORWARD_CLIENT_RATE_PER_SECOND', path: ['forward', 'clientRatePerSecond'] },
  { env: 'FORWARD_CLIENT_RATE_BURST', path: ['forward', 'clientRateBurst'] },
  { env: 'FORWARD_CALLER_RATE_PER_SECOND', path: ['forward', 'callerRatePerSecond'] },
  { env: 'FORWARD_CALLER_RATE_BURST', path: ['forward', 'callerRateBurst'] },
  { env: 'NODE_ENV', path: ['nodeEnv'] },
  { env: 'CALLER_AUTH_MODE', path: ['callerAuth', 'mode'] },
  { env: 'CALLER_AUTH_ALLOW_NONE', path: ['callerAuth', 'allowNone'] },
  { env: 'CALLER_API_KEYS_SECRET_ID', path: ['callerAuth', 'apiKeysSource', 'secretId'] },
  { env: 'CALLER_API_KEYS_FILE', path: ['callerAuth', 'apiKeysSource', 'file'] },
  { env: 'CALLER_API_KEYS_RELOAD_SECONDS', path: ['callerAuth', 'apiKeysReloadSeconds'] },
  { env: 'CALLER_AUTH_JWKS_URL', path: ['callerAuth', 'kubernetes', 'jwksUrl'] },
  { env: 'CALLER_AUTH_ISSUER', path: ['callerAuth', 'kubernetes', 'issuer'] },
  { env: 'CALLER_AUTH_AUDIENCE', path: ['callerAuth', 'kubernetes', 'audience'] },
  { env: 'CALLER_AUTH_SUBJECTS', path: ['callerAuth', 'kubernetes', 'subjects'] },
  {
    env: 'CALLER_AUTH_MAX_TOKEN_LIFETIME_SECONDS',
    path: ['callerAuth', 'kubernetes', 'maxTokenLifetimeSeconds'],
  },
  { env: 'CACHE_KEY_SECRET_ID', path: ['cacheEncryption', 'key', 'secretId'] },
  { env: 'CACHE_KEY_FILE', path: ['cacheEncryption', 'key', 'file'] },
  { env: 'REDIS_MODE', path: ['redis', 'mode'] },
  { env: 'REDIS_SENTINELS', path: ['redis', 'sentinel', 'nodes'] },
  { env: 'REDIS_SENTINEL_MASTER', path: ['redis', 'sentinel', 'masterName'] },
  { env: 'REDIS_SENTINEL_USERNAME', path: ['redis', 'sentinel', 'username'] },
  { env: 'REDIS_SENTINEL_PASSWORD_SECRET_ID', path: ['redis', 'sentinel', 'password', 'secretId'] },
  { env: 'REDIS_SENTINEL_PASSWORD_FILE', path: ['redis', 'sentinel', 'password', 'file'] },
  { env: 'REDIS_CLUSTER_NODES', path: ['redis', 'cluster', 'nodes'] },
  { env: 'REDIS_USERNAME', path: ['redis', 'username'] },
  { env: 'REDIS_PASSWORD_SECRET_ID', path: ['redis', 'password', 'secretId'] },
  { env: 'REDIS_PASSWORD_FILE', path: ['redis', 'password', 'file'] },
  { env: 'REDIS_TLS', path: ['redis', 'tls', 'enabled'] },
  { env: 'REDIS_TLS_CA_FILE', path: ['redis', 'tls', 'caFile'] },
  { env: 'REDIS_TLS_CERT_FILE', path: ['redis', 'tls', 'certFile'] },
  { env: 'REDIS_TLS_KEY_FILE', path: ['redis', 'tls', 'keyFile'] },
  { env: 'REDIS_TLS_SERVER_NAME', path: ['redis', 'tls', 'serverName'] },
];

/** A setting nobody supplied is named by the variable(s) that would supply it. */
const UNSUPPLIED_NAMES = new Map<string, string>([
  ...ENV_SETTINGS.map(({ env, path }) => [path.join('.'), env] as [string, string]),
  ['callerAuth.apiKeysSource', 'CALLER_API_KEYS_SECRET_ID or CALLER_API_KEYS_FILE'],
  ['cacheEncryption.key', 'CACHE_KEY_SECRET_ID or CACHE_KEY_FILE'],
  ['redis.password', 'REDIS_PASSWORD_SECRET_ID or REDIS_PASSWORD_FILE'],
  ['redis.sentinel.password', 'REDIS_SENTINEL_PASSWORD_SECRET_ID or REDIS_SENTINEL_PASSWORD_FILE'],
]);

/** They build `clients[0]` when the file defines no clients. */
const CLIENT_ENV: ReadonlyArray<{ env: string; path: Path }> = [
  { env: 'CLIENT_ID', path: ['id'] },
  { env: 'PROVIDER_AUTH_URL', path: ['authUrl'] },
  { env: 'PROVIDER_BASE_URL', path: ['baseUrl'] },
  { env: 'PROVIDER_ORDERS_PATH', path: ['ordersPath'] },
  { env: 'CREDENTIALS_SECRET_ID', path: ['credentials', 'secretId'] },
  { env: 'CREDENTIALS_FILE', path: ['credentials', 'file'] },
  { env: 'TOKEN_REQUEST_GRANT', path: ['tokenRequest', 'grant'] },
  { env: 'TOKEN_REQUEST_URL', path: ['tokenRequest', 'url'] },
  { env: 'TOKEN_REQUEST_AUTH', path: ['tokenRequest', 'auth'] },
  { env: 'TOKEN_REQUEST_SCOPE', path: ['tokenRequest', 'scope'] },
  { env: 'TOKEN_REQUEST_AUDIENCE', path: ['tokenRequest', 'audience'] },
  { env: 'TOKEN_REQUEST_RESOURCE', path: ['tokenRequest', 'resource'] },
  { env: 'TOKEN_REQUEST_PARAMS', path: ['tokenRequest', 'params'] },
  { env: 'TOKEN_REQUEST_HEADERS', path: ['tokenRequest', 'headers'] },
  {
    env: 'TOKEN_REQUEST_ASSERTION_LIFETIME_SECONDS',
    path: ['tokenRequest', 'assertion', 'lifetimeSeconds'],
  },
  { env: 'TOKEN_REQUEST_ASSERTION_ALG', path: ['tokenRequest', 'assertion', 'alg'] },
  { env: 'TOKEN_REQUEST_ASSERTION_KID', path: ['tokenRequest', 'assertion', 'kid'] },
];

export const DEFAULT_CLIENT_ID = 'default';

/** Names every bad setting (by variable or file path), never echoing a value. */
export function loadConfig(env: Readonly<Record<string, string | undefined>>): BrokerConfig {
  const fileName = nonEmpty(env.BROKER_CONFIG_FILE);
  const raw: Record<string, unknown> = fileName ? readConfigFile(fileName) : {};
  const origins = new Map<string, string>();

  for (const { env: name, path } of ENV_SETTINGS) {
    const value = nonEmpty(env[name]);
    if (value === undefined) continue;
    setPath(raw, path, value);
    origins.set(path.join('.'), name);
  }

  const clientEnv = CLIENT_ENV.filter(({ env: name }) => nonEmpty(env[name]) !== undefined);
  if (raw.clients !== undefined) {
    if (clientEnv.length > 0) {
      throw ConfigException.of(ConfigErrorCode.Invalid, [
        `${clientEnv.map((c) => c.env).join(', ')}: the config file (BROKER_CONFIG_FILE) already defines clients; configure clients in one place only`,
      ]);
    }
  } else {
    const client: Record<string, unknown> = { id: DEFAULT_CLIENT_ID, credentials: {} };
    for (const { env: name, path } of CLIENT_ENV) {
      const value = nonEmpty(env[name]);
      if (value !== undefined) setPath(client, path, value);
      origins.set(['clients', 0, ...path].join('.'), name);
    }
    origins.set('clients.0.credentials', 'CREDENTIALS_SECRET_ID or CREDENTIALS_FILE');
    raw.clients = [client];
  }

  const result = brokerConfigSchema.safeParse(raw);
  if (!result.success) {
    throw ConfigException.of(
      ConfigErrorCode.Invalid,
      describeIssues(result.error, raw, origins, fileName && shownReference(fileName)),
      { cause: result.error },
    );
  }
  return result.data;
}

function describeIssues(
  error: ZodError,
  raw: Record<string, unknown>,
  origins: Map<string, string>,
  fileName: string | undefined,
): string[] {
  return error.issues.map((issue) => {
    const key = issue.path.map(String).join('.');
    const absent = getPath(raw, issue.path) === undefined;
    const unsupplied = absent ? UNSUPPLIED_NAMES.get(key) : undefined;
    const setting =
      originOf(origins, issue.path) ??
      (unsupplied && fileName
        ? `${unsupplied} (or ${formatPath(issue.path)} in ${fileName})`
        : unsupplied) ??
      (fileName
        ? issue.path.length > 0
          ? `${fileName}: ${formatPath(issue.path)}`
          : fileName
        : formatPath(issue.path));
    // Only the message, never the input: the offending value may be a misplaced secret.
    const missing = issue.code === 'invalid_type' && absent;
    const message =
      issue.code === 'unrecognized_keys'
        ? unknownKeys(issue.keys)
        : missing
          ? 'required'
          : issue.message;
    return `${setting}: ${message}`;
  });
}

/**
 * Zod's own message quotes every unknown key, and a secret pasted into the file as a key (or a
 * key and value on one line) would reach stderr: only keys that look like setting names are named.
 */
function unknownKeys(keys: readonly string[]): string {
  const named = keys.filter(looksLikeSettingName).map((k) => `"${k}"`);
  const hidden = keys.length - named.length;
  const parts = [
    ...named,
    ...(hidden === 0
      ? []
      : [hidden === 1 ? 'an unknown key (not shown)' : `${hidden} unknown keys (not shown)`]),
  ];
  return `unknown ${keys.length === 1 ? 'key' : 'keys'} ${parts.join(', ')}; check the spelling against docs/configuration.md`;
}

/** Its own, else the nearest enclosing one, else those that set fields inside it. */
function originOf(origins: Map<string, string>, path: readonly PropertyKey[]): string | undefined {
  for (let n = path.length; n > 0; n--) {
    const found = origins.get(path.slice(0, n).map(String).join('.'));
    if (found !== undefined) return found;
  }
  if (path.length === 0) return undefined;
  const prefix = `${path.map(String).join('.')}.`;
  const inside = [...origins].filter(([k]) => k.startsWith(prefix)).map(([, env]) => env);
  return inside.length > 0 ? [...new Set(inside)].join(', ') : undefined;
}

function getPath(root: unknown, path: readonly PropertyKey[]): unknown {
  let node = root;
  for (const key of path) {
    if (node === null || typeof node !== 'object') return undefined;
    node = (node as Record<PropertyKey, unknown>)[key];
  }
  return node;
}

/** A record's key (a subject, a header name) is printed only when it could be a name. */
function formatPath(path: readonly PropertyKey[]): string {
  return path
    .map((p, i) =>
      typeof p === 'number' ? `[${p}]` : `${i === 0 ? '' : '.'}${shownKey(String(p))}`,
    )
    .join('');
}

/** Names (`system:serviceaccount:shop:checkout`, `X-Tenant`), not what a secret looks like. */
function shownKey(key: string): string {
  return looksLikeSettingName(key) || shownReference(key) === key ? key : '(a key not shown)';
}

/** Hundreds of clients take tens of KiB; far more is a mistake, and YAML parsing grows with it. */
const CONFIG_FILE_MAX_BYTES = 1024 * 1024;

function readConfigFile(fileName: string): Record<string, unknown> {
  let text: string;
  try {
    text = readCapped(fileName, CONFIG_FILE_MAX_BYTES);
  } catch (cause) {
    if (cause instanceof ConfigException) throw cause;
    const reason = (cause as NodeJS.ErrnoException).code ?? 'unreadable';
    throw ConfigException.of(
      ConfigErrorCode.FileUnreadable,
      [`BROKER_CONFIG_FILE: cannot read the file (${reason}); check the path and permissions`],
      { cause },
    );
  }
  let parsed: unknown;
  try {
    // YAML is a superset of JSON, so one parser reads both formats.
    parsed = parseYaml(text);
  } catch (cause) {
    throw ConfigException.of(
      ConfigErrorCode.FileUnparsable,
      ['BROKER_CONFIG_FILE: not valid YAML or JSON'],
      { cause },
    );
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw ConfigException.of(ConfigErrorCode.FileUnparsable, [
      'BROKER_CONFIG_FILE: must hold a mapping (an object) at the top level',
    ]);
  }
  return parsed as Record<string, unknown>;
}

/** Reads rather than trusts `stat`: a FIFO or a device reports size 0 and never ends. */
function readCapped(fileName: string, limit: number): string {
  const fd = openSync(fileName, 'r');
  try {
    const buffer = Buffer.alloc(limit + 1);
    let length = 0;
    for (;;) {
      const n = readSync(fd, buffer, length, buffer.length - length, null);
      if (n === 0) break;
      length += n;
      if (length > limit) {
        throw ConfigException.of(ConfigErrorCode.FileUnreadable, [
          `BROKER_CONFIG_FILE: the file is over ${limit} bytes (1 MiB); it should hold clients and callers only, with secrets referenced, not inlined`,
        ]);
      }
    }
    return buffer.toString('utf8', 0, length);
  } finally {
    closeSync(fd);
  }
}

function setPath(target: Record<string, unknown>, path: Path, value: unknown): void {
  let node: Record<string | number, unknown> = target;
  path.slice(0, -1).forEach((key) => {
    const next = node[key];
    if (next === null || typeof next !== 'object') node[key] = {};
    node = node[key] as Record<string | number, unknown>;
  });
  node[path[path.length - 1]] = value;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === '' ? undefined : value;
}
