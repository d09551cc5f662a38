import { BlockList, isIP } from 'node:net';
import { z } from 'zod';
import { type CallerAuthSettings, callerAuthSettingsSchema } from './caller-auth.schema';
import { clientSchema, credentialsSourceSchema } from './client.schema';
import { auditSettingsSchema, httpSettingsSchema, logSettingsSchema } from './http.schema';
import {
  forwardSettingsSchema,
  ordersSettingsSchema,
  providerSettingsSchema,
  tokenSettingsSchema,
} from './provider.schema';
import { redisConfigured, redisSettingsSchema } from './redis.schema';
import { commaList, int, type Issue, issuesOf } from './schema-parts';

/**
 * Shape and defaults only: the loader feeds it from the environment and an optional file. Secret
 * *values* never live here, only references, so a printed or logged config cannot leak them.
 */

const cacheEncryptionSchema = z
  .object({
    key: credentialsSourceSchema.optional().meta({
      description:
        'Secret (or file) holding the AES-256 key for the token in Redis: one base64 ' +
        '32-byte key (`openssl rand -base64 32`), or `{"current": "<base64>", "previous": ' +
        '["<base64>", ...]}` to rotate (read with every key, write with `current`). ' +
        'Unset: the token is stored in clear, with a warning; refused in production (any ' +
        '`NODE_ENV` but `development` or `test`) when Redis is configured.',
      envFields: { secretId: 'CACHE_KEY_SECRET_ID', file: 'CACHE_KEY_FILE' },
    }),
  })
  .strict();

/** When a replica reports ready (`/health/ready`). */
const readinessSchema = z
  .object({
    requiredClients: z
      .preprocess(commaList, z.array(z.string().min(1)))
      .default([])
      .meta({
        description:
          'Clients each of which must have a servable token for the replica to be ready; a comma ' +
          'list in the environment. Empty: ready once any client has one, so that one merchant ' +
          'whose token endpoint is down does not take every pod, and every other merchant, out ' +
          'of rotation (the failing client is named in the admin readiness details, ' +
          '`token_broker_client_unservable` and the `TokenBrokerClientUnservable` alert).',
        defaultText: '[] (any one client)',
        env: 'READINESS_REQUIRED_CLIENTS',
      }),
  })
  .strict();

const brokerConfigFields = z
  .object({
    http: httpSettingsSchema.default(httpSettingsSchema.parse({})),
    log: logSettingsSchema.default(logSettingsSchema.parse({})),
    audit: auditSettingsSchema.default(auditSettingsSchema.parse({})),
    redis: redisSettingsSchema.default(redisSettingsSchema.parse({})),
    token: tokenSettingsSchema.default(tokenSettingsSchema.parse({})),
    provider: providerSettingsSchema.default(providerSettingsSchema.parse({})),
    orders: ordersSettingsSchema.default(ordersSettingsSchema.parse({})),
    forward: forwardSettingsSchema.default(forwardSettingsSchema.parse({})),
    clients: z.array(clientSchema).min(1, { message: 'configure at least one client' }),
    nodeEnv: z
      .string()
      .min(1)
      .default('production')
      .meta({
        description:
          '`NODE_ENV`; anything but `development` or `test` (`production`, ' +
          '`Production`, `prod`...) is production, where development conveniences (no ' +
          'caller auth, clear cache, plain `http://` to the provider) are errors. ' +
          'Unset is production too: a deployment that forgets it fails closed; local ' +
          'runs ask for `development` (the sandbox does) or `test` (Jest does).',
        env: 'NODE_ENV',
      }),
    // Parsed even when absent, so a missing section reports the missing mode by its name.
    callerAuth: z.preprocess((v) => v ?? {}, callerAuthSettingsSchema),
    cacheEncryption: cacheEncryptionSchema.default({}),
    readiness: readinessSchema.default({ requiredClients: [] }),
    configReloadSeconds: int(0, 86_400)
      .default(30)
      .meta({
        description:
          'Look at `BROKER_CONFIG_FILE` this often and, when its content changed, apply its ' +
          'client list (clients started and stopped without a restart; see docs/operations.md, ' +
          '"Adding and removing clients"); 0 turns the watch off (`POST /admin/reload` still ' +
          'applies it).',
        env: 'CONFIG_RELOAD_SECONDS',
      }),
  })
  .strict();

export const brokerConfigSchema = brokerConfigFields
  .superRefine((cfg, ctx) => refineSecurity(cfg, issuesOf(ctx)))
  .superRefine((cfg, ctx) => {
    const issue = issuesOf(ctx);
    const seen = new Set<string>();
    cfg.clients.forEach((c, i) => {
      if (seen.has(c.id)) issue(['clients', i, 'id'], 'duplicate client id');
      seen.add(c.id);
    });
    cfg.readiness.requiredClients.forEach((id, i) => {
      if (!seen.has(id)) issue(['readiness', 'requiredClients', i], 'not a configured client id');
    });
    if (cfg.token.refreshAheadSeconds >= cfg.token.defaultLifetimeSeconds) {
      issue(['token', 'refreshAheadSeconds'], 'must be shorter than token.defaultLifetimeSeconds');
    }
    if (cfg.token.minRefreshIntervalMs + 1000 > cfg.token.defaultLifetimeSeconds * 1000) {
      issue(
        ['token', 'minRefreshIntervalMs'],
        'must be at least 1 s shorter than token.defaultLifetimeSeconds: tokens of that lifetime could not be served between two refreshes',
      );
    }
  });

export type BrokerConfig = z.infer<typeof brokerConfigSchema>;

/**
 * Whether `NODE_ENV` names a development setting. Only the two exact names do: a misspelt
 * production value (`Production`, `prod`) must fail closed, not unlock development shortcuts.
 */
export function isDevelopmentEnv(nodeEnv: string): boolean {
  return nodeEnv === 'development' || nodeEnv === 'test';
}

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** Whether a listen address (or a URL's host) only reaches this machine. */
function isLoopbackHost(host: string): boolean {
  if (host === 'localhost') return true;
  // A URL writes an IPv6 host in brackets.
  const bare = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  const family = isIP(bare);
  return family !== 0 && LOOPBACK.check(bare, family === 4 ? 'ipv4' : 'ipv6');
}

/** What the security checks read. */
type ParsedFields = z.output<typeof brokerConfigFields>;

/** Cross-field checks of caller authentication and cache encryption. */
function refineSecurity(cfg: ParsedFields, issue: Issue): void {
  const production = !isDevelopmentEnv(cfg.nodeEnv);
  const auth = cfg.callerAuth;
  switch (auth.mode) {
    case 'none':
      checkNoCallerAuth(cfg, production, issue);
      break;
    case 'api-key':
      checkApiKeyCallerAuth(auth, issue);
      break;
    case 'kubernetes':
      checkKubernetesCallerAuth(auth, issue);
      break;
  }
  checkGrants(cfg, issue);
  checkCacheEncryption(cfg, production, issue);
  if (production) checkProviderTransport(cfg, issue);
}

/** Mode `none`: development only, on loopback, and turned off explicitly. */
function checkNoCallerAuth(cfg: ParsedFields, production: boolean, issue: Issue): void {
  if (production) {
    issue(
      ['callerAuth', 'mode'],
      '"none" is refused unless NODE_ENV is "development" or "test"; use "api-key" or "kubernetes"',
    );
    return;
  }
  // Decided by where the broker listens, not by NODE_ENV alone: anyone who can connect
  // could take the merchants' tokens.
  if (!isLoopbackHost(cfg.http.host)) {
    issue(
      ['callerAuth', 'mode'],
      '"none" listens on loopback only: set HOST (http.host) to 127.0.0.1, ::1 or localhost, or use "api-key" or "kubernetes"',
    );
  }
  if (!cfg.callerAuth.allowNone) {
    issue(
      ['callerAuth', 'allowNone'],
      'must be true to turn caller authentication off (mode "none", local development only)',
    );
  }
}

/** Mode `api-key`: the keys are listed or come from a secret. */
function checkApiKeyCallerAuth(auth: CallerAuthSettings, issue: Issue): void {
  if (auth.apiKeys === undefined && auth.apiKeysSource === undefined) {
    issue(
      ['callerAuth', 'apiKeysSource'],
      'required in mode "api-key" (or list callerAuth.apiKeys in the config file)',
    );
  }
}

/** Mode `kubernetes`: where to check tokens, and at least one service account granted. */
function checkKubernetesCallerAuth(auth: CallerAuthSettings, issue: Issue): void {
  for (const field of ['jwksUrl', 'issuer'] as const) {
    if (auth.kubernetes[field] === undefined) {
      issue(['callerAuth', 'kubernetes', field], 'required in mode "kubernetes"');
    }
  }
  if (Object.keys(auth.kubernetes.subjects).length === 0) {
    issue(
      ['callerAuth', 'kubernetes', 'subjects'],
      'grant at least one service account in mode "kubernetes"',
    );
  }
}

/** Every caller's grant names configured clients. */
function checkGrants(cfg: ParsedFields, issue: Issue): void {
  const auth = cfg.callerAuth;
  // A grant naming an unconfigured client is a typo that would surface as a puzzling 403.
  const ids = new Set(cfg.clients.map((c) => c.id));
  const checkGrant = (clients: readonly string[], path: (string | number)[]) =>
    clients.forEach((c, i) => {
      if (c !== '*' && !ids.has(c)) issue([...path, i], 'not a configured client id');
    });
  auth.apiKeys?.forEach((k, i) => checkGrant(k.clients, ['callerAuth', 'apiKeys', i, 'clients']));
  for (const [subject, grant] of Object.entries(auth.kubernetes.subjects)) {
    checkGrant(grant.clients, ['callerAuth', 'kubernetes', 'subjects', subject]);
  }
}

/**
 * In production a shared secret or a token never crosses the network in clear: every client's
 * token endpoint (the client secret goes there, the token comes back) and API (each call carries
 * the bearer token) are `https://`, or on this machine (a sidecar, a local emulator).
 */
function checkProviderTransport(cfg: ParsedFields, issue: Issue): void {
  cfg.clients.forEach((client, i) => {
    const { grant, auth, url, issuer } = client.tokenRequest;
    const sendsSecret = auth === 'client_secret_basic' || auth === 'client_secret_post';
    const checked: Array<{ path: PropertyKey[]; value: string | undefined; carries: string }> = [
      grant === 'provider-query'
        ? { path: ['authUrl'], value: client.authUrl, carries: 'the client secret' }
        : {
            path: ['tokenRequest', 'url'],
            value: url,
            carries: sendsSecret ? 'the client secret' : 'the token it answers',
          },
      // The metadata names the token endpoint: whoever could change it would get the secret.
      { path: ['tokenRequest', 'issuer'], value: issuer, carries: 'the token endpoint' },
      { path: ['baseUrl'], value: client.baseUrl, carries: 'the bearer token' },
    ];
    for (const { path, value, carries } of checked) {
      if (value === undefined || !value.startsWith('http://')) continue;
      if (isLoopbackHost(new URL(value).hostname)) continue;
      issue(
        ['clients', i, ...path],
        `must be https:// in production (NODE_ENV not "development" or "test"): ${carries} travels on it; plain http:// is accepted for a loopback host only (127.0.0.1, ::1, localhost)`,
      );
    }
  });
}

function checkCacheEncryption(cfg: ParsedFields, production: boolean, issue: Issue): void {
  if (production && redisConfigured(cfg.redis) && cfg.cacheEncryption.key === undefined) {
    issue(
      ['cacheEncryption', 'key'],
      'required when Redis is used and NODE_ENV is not "development" or "test": the token must be encrypted at rest (generate a key with `openssl rand -base64 32`)',
    );
  }
}

export type TokenSettings = BrokerConfig['token'];
export type ProviderSettings = BrokerConfig['provider'];
export type RedisSettings = BrokerConfig['redis'];
export type OrdersSettings = BrokerConfig['orders'];

/** Undici's body timeout is an idle timer a server trickling bytes never trips: one deadline. */
export function tokenCallDeadlineMs(provider: ProviderSettings): number {
  return provider.connectTimeoutMs + provider.responseTimeoutMs;
}

/** Connect to last byte, enforced as one deadline; idempotency leases are sized from it. */
export function ordersCallDeadlineMs(orders: OrdersSettings): number {
  return orders.connectTimeoutMs + orders.headersTimeoutMs + orders.bodyTimeoutMs;
}
