import { z } from 'zod';

/**
 * The broker's configuration, validated once at start-up.
 *
 * Two sources feed it (see `config.loader.ts`): environment variables for the one-client case
 * (names fixed by DESIGN.md) and an optional YAML/JSON file (`BROKER_CONFIG_FILE`) for many
 * clients and callers. This file only describes the *shape* and defaults; nothing here reads
 * the environment.
 *
 * Secret *values* never live here: credentials and keys are referenced by a Secrets Manager id
 * or a file path, so a printed or logged config cannot leak them.
 */

const CLIENT_ID_PATTERN = /^[a-z0-9][a-z0-9._-]{0,62}$/;

const httpUrl = z
  .string()
  .refine((v) => URL.canParse(v) && /^https?:\/\/[^/]/.test(v), {
    message: 'must be an absolute http:// or https:// URL',
  })
  // A trailing slash would produce `//api/...` when joined with the SPEC paths.
  .transform((v) => v.replace(/\/+$/, ''));

const path = z
  .string()
  .regex(/^\/[A-Za-z0-9._~!$&'()*+,;=:@/%-]*$/, { message: 'must be an absolute URL path' });

/** Where a client's `{"client_id","client_secret"}` JSON is read from: exactly one source. */
export const credentialsSourceSchema = z
  .object({
    /** AWS Secrets Manager secret name or ARN. Region/endpoint come from the AWS SDK's env. */
    secretId: z.string().min(1).optional(),
    /** A file holding the same JSON (local development, or a Secrets Store CSI mount). */
    file: z.string().min(1).optional(),
  })
  .strict()
  .refine((c) => (c.secretId === undefined) !== (c.file === undefined), {
    message: 'set exactly one of secretId or file',
  });
export type CredentialsSource = z.infer<typeof credentialsSourceSchema>;

/** One set of provider credentials: one merchant in one environment (e.g. `acme-preprod`). */
export const clientSchema = z
  .object({
    /** Client id used in `?client=`, cache keys, locks and metric labels. */
    id: z.string().regex(CLIENT_ID_PATTERN, {
      message: 'must be 1-63 lowercase letters, digits, ".", "_" or "-"',
    }),
    /** The provider's `{auth_url}`; the token is requested at `{authUrl}/api/auth/v1/oauth/token`. */
    authUrl: httpUrl,
    /** The provider's `{base_url}` for the checkout API. */
    baseUrl: httpUrl,
    /** @default '/api/checkout/v1/orders' (the documented path; the plugin uses `/api/flexpay/v1/orders`) */
    ordersPath: path.default('/api/checkout/v1/orders'),
    credentials: credentialsSourceSchema,
  })
  .strict();
export type ClientConfig = z.infer<typeof clientSchema>;

const seconds = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const millis = (min: number, max: number) => z.coerce.number().int().min(min).max(max);

export const tokenSettingsSchema = z
  .object({
    /** Start refreshing this long before expiry. @default 300 */
    refreshAheadSeconds: seconds(1, 86_400).default(300),
    /** Lifetime assumed when the provider sends no `expires_in`. @default 1800 */
    defaultLifetimeSeconds: seconds(1, 86_400).default(1800),
    /** Longest a caller waits in the mandatory window before a 503. @default 5000 */
    waitTimeoutMs: millis(100, 120_000).default(5000),
    /** Redlock lease; auto-extended while the holder is alive, so it only bounds a dead holder. @default 10000 */
    lockTtlMs: millis(200, 300_000).default(10_000),
    /** First retry delay after a failed refresh (full jitter). @default 500 */
    backoffBaseMs: millis(10, 60_000).default(500),
    /** Largest retry delay; shrinks further as expiry approaches. @default 30000 */
    backoffMaxMs: millis(100, 600_000).default(30_000),
    /** Re-read credentials this often even without a failure (rotation). @default 3600 */
    credentialsReloadSeconds: seconds(10, 604_800).default(3600),
  })
  .strict();

export const providerSettingsSchema = z
  .object({
    /** TCP connect timeout to the provider. @default 2000 */
    connectTimeoutMs: millis(50, 60_000).default(2000),
    /** Time to the response headers and between body chunks. @default 5000 */
    responseTimeoutMs: millis(50, 120_000).default(5000),
    /** Token responses larger than this are rejected as malformed. @default 65536 */
    maxTokenResponseBytes: z.coerce.number().int().min(1024).max(10_485_760).default(65_536),
  })
  .strict();

export const redisSettingsSchema = z
  .object({
    /** `redis://` or `rediss://` URL. Unset: in-memory store, single replica only. */
    url: z
      .string()
      .regex(/^rediss?:\/\/[^\s]+$/, { message: 'must be a redis:// or rediss:// URL' })
      .optional(),
    /** Every Redis command fails after this long, so no request queues behind a dead link. @default 500 */
    commandTimeoutMs: millis(20, 30_000).default(500),
    /** @default 2000 */
    connectTimeoutMs: millis(50, 60_000).default(2000),
    /** Health ping interval; also how soon a returning Redis is noticed. @default 1000 */
    pingIntervalMs: millis(50, 60_000).default(1000),
  })
  .strict();

export const httpSettingsSchema = z
  .object({
    /** @default 8080 */
    port: z.coerce.number().int().min(0).max(65_535).default(8080),
    /** @default '0.0.0.0' */
    host: z.string().min(1).default('0.0.0.0'),
    /** Grace period for in-flight requests on SIGTERM. @default 10000 */
    shutdownGraceMs: millis(0, 300_000).default(10_000),
  })
  .strict();

export const logSettingsSchema = z
  .object({
    /** @default 'info' */
    level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  })
  .strict();

/** The whole validated configuration, as injected under `BROKER_CONFIG`. */
export const brokerConfigSchema = z
  .object({
    http: httpSettingsSchema.default(httpSettingsSchema.parse({})),
    log: logSettingsSchema.default(logSettingsSchema.parse({})),
    redis: redisSettingsSchema.default(redisSettingsSchema.parse({})),
    token: tokenSettingsSchema.default(tokenSettingsSchema.parse({})),
    provider: providerSettingsSchema.default(providerSettingsSchema.parse({})),
    clients: z.array(clientSchema).min(1, { message: 'configure at least one client' }),
  })
  .strict()
  .superRefine((cfg, ctx) => {
    const seen = new Set<string>();
    cfg.clients.forEach((c, i) => {
      if (seen.has(c.id)) {
        ctx.addIssue({
          code: 'custom',
          path: ['clients', i, 'id'],
          message: 'duplicate client id',
        });
      }
      seen.add(c.id);
    });
    if (cfg.token.refreshAheadSeconds >= cfg.token.defaultLifetimeSeconds) {
      ctx.addIssue({
        code: 'custom',
        path: ['token', 'refreshAheadSeconds'],
        message: 'must be shorter than token.defaultLifetimeSeconds',
      });
    }
  });

export type BrokerConfig = z.infer<typeof brokerConfigSchema>;
export type TokenSettings = BrokerConfig['token'];
export type ProviderSettings = BrokerConfig['provider'];
export type RedisSettings = BrokerConfig['redis'];
