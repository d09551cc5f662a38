import { BlockList, isIP } from 'node:net';
import { z } from 'zod';

/**
 * The broker's configuration, validated once at start-up.
 *
 * Two sources feed it (see `config.loader.ts`): environment variables for the one-client case
 * (names fixed by the broker's contract) and an optional YAML/JSON file (`BROKER_CONFIG_FILE`)
 * for many clients and callers. This file only describes the *shape* and defaults; nothing here
 * reads the environment.
 *
 * Secret *values* never live here: credentials and keys are referenced by a Secrets Manager id
 * or a file path, so a printed or logged config cannot leak them.
 */

const CLIENT_ID_PATTERN = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/**
 * `value` without its trailing slashes. A loop, not `/\/+$/`: that regex backtracks over every
 * run of slashes not at the end, quadratic in a long configured URL.
 */
export function trimTrailingSlashes(value: string): string {
  let end = value.length;
  while (end > 0 && value.charCodeAt(end - 1) === 0x2f) end--;
  return value.slice(0, end);
}

function noUserinfo(url: URL): boolean {
  return url.username === '' && url.password === '';
}

/**
 * An absolute http(s) URL kept exactly as written (a token endpoint is matched verbatim).
 * Undici and the broker's own errors quote the URL they called: a password in it would reach
 * logs and problem bodies, so credentials have their own settings.
 */
const exactHttpUrl = z
  .string()
  .refine((v) => URL.canParse(v) && /^https?:\/\/[^/]/.test(v), {
    message: 'must be an absolute http:// or https:// URL',
  })
  .refine((v) => !URL.canParse(v) || noUserinfo(new URL(v)), {
    message:
      'must not hold a user name or password ("user:password@host"); the URL is quoted in errors and logs, credentials belong in their own settings',
  });

/**
 * An absolute http(s) URL without trailing slashes: a trailing slash would produce `//api/...`
 * when joined with the provider's paths (`/api/auth/v1/oauth/token`, `/api/checkout/v1/orders`).
 */
const httpUrl = exactHttpUrl.transform(trimTrailingSlashes);

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

/**
 * Where a client's credentials are read from: the JSON from Secrets Manager or a file, or, for
 * the key-based methods, PEM files as a Kubernetes TLS Secret holds them (`tls.crt`, `tls.key`).
 */
export const clientCredentialsSourceSchema = z
  .object({
    /** AWS Secrets Manager secret name or ARN. Region/endpoint come from the AWS SDK's env. */
    secretId: z.string().min(1).optional(),
    /** A file holding the same JSON (local development, or a Secrets Store CSI mount). */
    file: z.string().min(1).optional(),
    /** The client id, with `privateKeyFile` (the files hold only key material). */
    clientId: z.string().min(1).optional(),
    /** PEM client certificate (chain) file for `tls_client_auth`, e.g. a mounted `tls.crt`. */
    certificateFile: z.string().min(1).optional(),
    /** PEM (or JWK) private key file for `private_key_jwt` and `tls_client_auth`, e.g. `tls.key`. */
    privateKeyFile: z.string().min(1).optional(),
  })
  .strict()
  .superRefine((c, ctx) => {
    const issue = (path: string, message: string) =>
      ctx.addIssue({ code: 'custom', path: [path], message });
    const kinds = [c.secretId, c.file, c.privateKeyFile].filter((v) => v !== undefined).length;
    if (kinds !== 1 && c.privateKeyFile !== undefined) {
      issue(
        'privateKeyFile',
        'key files replace the JSON: set privateKeyFile, secretId or file, one only',
      );
    } else if (kinds !== 1) {
      ctx.addIssue({ code: 'custom', path: [], message: 'set exactly one of secretId or file' });
    }
    if (c.privateKeyFile !== undefined && c.clientId === undefined) {
      issue('clientId', 'required with privateKeyFile: the key files do not hold the client id');
    }
    for (const field of ['clientId', 'certificateFile'] as const) {
      if (c[field] !== undefined && c.privateKeyFile === undefined) {
        issue(field, 'only with privateKeyFile; a secretId or file holds the client id and keys');
      }
    }
  });
export type ClientCredentialsSource = z.infer<typeof clientCredentialsSourceSchema>;

// --- Provider passthrough (issue #15) ---
/** The methods the provider passthrough forwards. */
export const FORWARD_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;
export type ForwardMethod = (typeof FORWARD_METHODS)[number];

/** One allow-list rule: these methods under this path prefix. */
export const forwardRuleSchema = z
  .object({
    /** Methods allowed under `prefix`. @default all six */
    methods: z
      .array(z.enum(FORWARD_METHODS))
      .min(1)
      .default([...FORWARD_METHODS]),
    /**
     * A provider path prefix ending in `/`, e.g. `/api/marketing/v1/`. Matched against the
     * request path after it was checked for tricks (`..`, `;`, encoded slashes, `//`): no
     * prefix can be escaped, and a prefix holding `;` could never match.
     */
    prefix: z.string().regex(/^\/(?:[A-Za-z0-9_~!$&'()*+,=:@-][A-Za-z0-9._~!$&'()*+,=:@-]*\/)*$/, {
      message:
        'must be an absolute path of plain segments ending in "/" (no "." or ".." segments, no "//", no ";", no percent-encoding), e.g. /api/marketing/v1/',
    }),
  })
  .strict();
export type ForwardRule = z.infer<typeof forwardRuleSchema>;

/** The default allow-list: every method under the checkout and marketing `v1` APIs. */
export const DEFAULT_FORWARD_RULES: readonly ForwardRule[] = [
  { methods: [...FORWARD_METHODS], prefix: '/api/checkout/v1/' },
  { methods: [...FORWARD_METHODS], prefix: '/api/marketing/v1/' },
];

/** What `/provider/<client>/...` may forward for one client. */
export const clientForwardSchema = z
  .object({
    /** Rules; a request passes if one rule allows its method and path. @default checkout and marketing v1, all methods */
    allow: z.array(forwardRuleSchema).default(() => DEFAULT_FORWARD_RULES.map((r) => ({ ...r }))),
  })
  .strict();
// --- end provider passthrough ---

/** How a client's token request is shaped on the wire. */
export const TOKEN_GRANTS = ['provider-query', 'rfc6749'] as const;
export type TokenGrant = (typeof TOKEN_GRANTS)[number];

/** How a client authenticates to the token endpoint (RFC 6749 §2.3, RFC 7523, RFC 8705). */
export const CLIENT_AUTH_METHODS = [
  'client_secret_basic',
  'client_secret_post',
  'private_key_jwt',
  'tls_client_auth',
] as const;
export type ClientAuthMethod = (typeof CLIENT_AUTH_METHODS)[number];

/** Signature algorithms for `private_key_jwt` client assertions. */
export const ASSERTION_ALGS = ['RS256', 'ES256', 'PS256', 'EdDSA'] as const;
export type AssertionAlg = (typeof ASSERTION_ALGS)[number];

/** Form parameters the broker sets itself: extra `params` may not override them. */
const RESERVED_PARAMS = new Set([
  'grant_type',
  'client_id',
  'client_secret',
  'client_assertion',
  'client_assertion_type',
  'scope',
  'audience',
  'resource',
]);
/** Headers the broker sets itself (or that frame the request): extra `headers` may not. */
const RESERVED_HEADERS = new Set([
  'authorization',
  'content-type',
  'content-length',
  'transfer-encoding',
  'connection',
  'host',
  'accept',
]);

/** A JSON object from an environment variable; a file's object passes as it is. */
function jsonObjectFromEnvironment(value: unknown, ctx: z.core.$RefinementCtx): unknown {
  if (typeof value !== 'string') return value;
  try {
    return JSON.parse(value) as unknown;
  } catch {
    ctx.addIssue({ code: 'custom', message: 'must be a JSON object, e.g. {"name": "value"}' });
    return z.NEVER;
  }
}

/** A comma list from an environment variable; a file's list passes as it is. */
const commaList = (v: unknown) =>
  typeof v === 'string'
    ? v
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '')
    : v;

/** How `private_key_jwt` client assertions are signed. */
export const assertionSettingsSchema = z
  .object({
    /** Signature algorithm; must match the key. @default 'RS256' */
    alg: z.enum(ASSERTION_ALGS).default('RS256'),
    /** `kid` header, when the server holds several keys for the client. @default the JWK's own `kid`, if any */
    kid: z.string().min(1).max(256).optional(),
    /** Assertion lifetime. @default 60 */
    lifetimeSeconds: z.coerce.number().int().min(5).max(300).default(60),
  })
  .strict();

/**
 * A client's token request: the provider's own dialect (the default), or a standard RFC 6749
 * client-credentials grant for any other API, with its client authentication method.
 */
export const tokenRequestSchema = z
  .object({
    /**
     * `provider-query`: the provider's dialect (`POST {authUrl}/api/auth/v1/oauth/token?grant_type=client_credentials`,
     * HTTP Basic, no body). `rfc6749`: a form-encoded body posted to `url`. @default 'provider-query'
     */
    grant: z.enum(TOKEN_GRANTS).default('provider-query'),
    /** The token endpoint, exactly as the authorization server publishes it. Required with grant `rfc6749`. */
    url: exactHttpUrl.optional(),
    /**
     * Client authentication: `client_secret_basic` or `client_secret_post` (credentials hold
     * `client_secret`), `private_key_jwt` (credentials hold `private_key`, PEM or JWK), or
     * `tls_client_auth` (credentials hold `certificate` and `private_key`, PEM). Only
     * `client_secret_basic` with grant `provider-query`. @default 'client_secret_basic'
     */
    auth: z.enum(CLIENT_AUTH_METHODS).default('client_secret_basic'),
    /** `scope` to request (space-separated). Grant `rfc6749` only. */
    scope: z.string().min(1).optional(),
    /** `audience` to request (Auth0, Okta and others). Grant `rfc6749` only. */
    audience: z.string().min(1).optional(),
    /**
     * RFC 8707 resource indicators (absolute URIs); a comma list in the environment. Grant
     * `rfc6749` only.
     */
    resource: z
      .preprocess(
        commaList,
        z
          .array(
            z.string().refine((v) => URL.canParse(v) && !v.includes('#'), {
              message: 'must be an absolute URI without a fragment (RFC 8707)',
            }),
          )
          .min(1),
      )
      .optional(),
    /**
     * Extra form parameters, e.g. `{"tenant": "acme"}`; JSON in the environment. Not for
     * secrets (those live in the credentials). Grant `rfc6749` only.
     */
    params: z
      .preprocess(
        jsonObjectFromEnvironment,
        z.record(z.string().regex(/^[A-Za-z0-9._~-]{1,64}$/), z.string().max(2048)),
      )
      .optional(),
    /**
     * Extra request headers, e.g. `{"X-Tenant": "acme"}`; JSON in the environment. Not for
     * secrets. Grant `rfc6749` only.
     */
    headers: z
      .preprocess(
        jsonObjectFromEnvironment,
        z.record(
          z.string().regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/),
          z.string().regex(/^[\t\x20-\x7e]{0,2048}$/, {
            message: 'must be printable ASCII, at most 2048 characters',
          }),
        ),
      )
      .optional(),
    /** The `private_key_jwt` client assertion. Auth `private_key_jwt` only. @default RS256, 60 s */
    assertion: assertionSettingsSchema.optional(),
  })
  .strict()
  .superRefine((r, ctx) => {
    const issue = (path: string[], message: string) =>
      ctx.addIssue({ code: 'custom', path, message });
    if (r.grant === 'provider-query') {
      for (const field of ['url', 'scope', 'audience', 'resource', 'params', 'headers'] as const) {
        if (r[field] !== undefined) {
          issue(
            [field],
            'only with grant "rfc6749": the provider\'s dialect ("provider-query") has a fixed request; set grant to "rfc6749" for a standard token endpoint',
          );
        }
      }
      if (r.auth !== 'client_secret_basic') {
        issue(
          ['auth'],
          'grant "provider-query" authenticates with client_secret_basic only; set grant to "rfc6749" for other methods',
        );
      }
    } else if (r.url === undefined) {
      issue(['url'], 'required with grant "rfc6749": the token endpoint URL');
    }
    if (r.assertion !== undefined && r.auth !== 'private_key_jwt') {
      issue(['assertion'], 'only with auth "private_key_jwt"');
    }
    if (r.auth === 'tls_client_auth' && r.url !== undefined && !r.url.startsWith('https:')) {
      issue(
        ['url'],
        'must be https:// with auth "tls_client_auth": the client certificate is presented in the TLS handshake',
      );
    }
    for (const name of Object.keys(r.params ?? {})) {
      if (RESERVED_PARAMS.has(name)) {
        issue(
          ['params', name],
          'is set by the broker; use tokenRequest.scope, audience or resource, and the credentials for client authentication',
        );
      }
    }
    for (const name of Object.keys(r.headers ?? {})) {
      if (RESERVED_HEADERS.has(name.toLowerCase())) {
        issue(['headers', name], 'is set by the broker and cannot be overridden');
      }
    }
  });
export type TokenRequestSettings = z.infer<typeof tokenRequestSchema>;

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
    /**
     * The client's credentials JSON: `{"client_id","client_secret"}`, `{"client_id","private_key"}`
     * (private_key_jwt; PEM or JWK) or `{"client_id","certificate","private_key"}`
     * (tls_client_auth; PEM). When the server refuses them, a Secrets Manager secret is re-read
     * at AWSCURRENT, then AWSPENDING, then AWSPREVIOUS, and the first version it accepts is used;
     * a file is re-read. Key-based methods may instead name PEM files (`clientId`,
     * `privateKeyFile` and, for tls_client_auth, `certificateFile`), re-read likewise.
     */
    credentials: clientCredentialsSourceSchema,
    /** The token request's shape and client authentication. @default the provider's dialect */
    tokenRequest: tokenRequestSchema.default(() => tokenRequestSchema.parse({})),
    /** The provider passthrough's allow-list for this client. @default checkout and marketing v1 */
    forward: clientForwardSchema.default(() => clientForwardSchema.parse({})),
  })
  .strict()
  .superRefine((c, ctx) => {
    // Key files carry no shared secret: they fit the key-based methods only, and mTLS needs both.
    const { auth } = c.tokenRequest;
    const issue = (field: string, message: string) =>
      ctx.addIssue({ code: 'custom', path: ['credentials', field], message });
    if (c.credentials.privateKeyFile === undefined) return;
    if (auth !== 'private_key_jwt' && auth !== 'tls_client_auth') {
      issue(
        'privateKeyFile',
        `only with auth "private_key_jwt" or "tls_client_auth"; auth "${auth}" needs a client_secret from secretId or file`,
      );
    } else if (auth === 'tls_client_auth' && c.credentials.certificateFile === undefined) {
      issue('certificateFile', 'required with auth "tls_client_auth" and privateKeyFile');
    } else if (auth === 'private_key_jwt' && c.credentials.certificateFile !== undefined) {
      issue(
        'certificateFile',
        'only with auth "tls_client_auth"; private_key_jwt signs with the key alone',
      );
    }
  });
export type ClientConfig = z.infer<typeof clientSchema>;

/** A boolean from a file (`true`) or an environment variable (`"true"`, `"1"`, `"yes"`...). */
const flag = z.union([z.boolean(), z.stringbool()]);

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
    /**
     * Fleet-wide floor between two tokens obtained from the provider (Redis-enforced; per
     * replica while Redis is down). Bounds the provider's request rate whatever the token
     * lifetime or the callers' `min_ttl`; a rejected or corrupt token lifts it. @default 5000
     */
    minRefreshIntervalMs: millis(100, 600_000).default(5000),
    /** Re-read credentials this often even without a failure (rotation). @default 3600 */
    credentialsReloadSeconds: seconds(10, 604_800).default(3600),
  })
  .strict();

export const providerSettingsSchema = z
  .object({
    /** TCP connect timeout to the provider. @default 2000 */
    connectTimeoutMs: millis(50, 60_000).default(2000),
    /**
     * Time to the response headers and between body chunks; the whole call, connect included,
     * ends at `connectTimeoutMs + responseTimeoutMs` however the body trickles. @default 5000
     */
    responseTimeoutMs: millis(50, 120_000).default(5000),
    /** Token responses larger than this are rejected as malformed. @default 65536 */
    maxTokenResponseBytes: z.coerce.number().int().min(1024).max(10_485_760).default(65_536),
  })
  .strict();

/** `POST /orders`: limits, timeouts and how long idempotency outcomes are kept. */
export const ordersSettingsSchema = z
  .object({
    /** How long the outcome of an order sent with an `Idempotency-Key` is kept for replays and conflicts. @default 86400 (24 h) */
    idempotencyTtlSeconds: seconds(60, 30 * 86_400).default(86_400),
    /** Largest order body accepted; a larger one is refused with 413 before it is read. @default 1048576 (1 MiB) */
    bodyLimitBytes: z.coerce.number().int().min(1024).max(16_777_216).default(1_048_576),
    /** TCP/TLS connect timeout to the checkout API. A connect failure never reached the provider: 502, safe to retry. @default 2000 */
    connectTimeoutMs: millis(50, 60_000).default(2000),
    /** Time from sending the order to the provider's response headers; past it the outcome is unknown (504). @default 10000 */
    headersTimeoutMs: millis(100, 300_000).default(10_000),
    /**
     * Longest pause between two chunks of the provider's response body. The whole call ends at
     * connect + headers + body timeouts however the body trickles (504, outcome unknown). @default 10000
     */
    bodyTimeoutMs: millis(100, 300_000).default(10_000),
    /** Provider responses larger than this are not relayed (502, outcome unknown). @default 1048576 (1 MiB) */
    maxResponseBytes: z.coerce.number().int().min(1024).max(16_777_216).default(1_048_576),
  })
  .strict();

// --- Provider passthrough (issue #15) ---
/** `/provider/<client>/...`: limits of the passthrough. Timeouts and the pool are the orders ones. */
export const forwardSettingsSchema = z
  .object({
    /**
     * Largest request body forwarded; a larger one is refused with 413. Request bodies are
     * held until the call ends (a 401 is retried with the same bytes). @default 1048576 (1 MiB)
     */
    bodyLimitBytes: z.coerce.number().int().min(1024).max(16_777_216).default(1_048_576),
    /** Largest provider answer relayed; it streams, and is cut off past this. @default 67108864 (64 MiB) */
    maxResponseBytes: z.coerce.number().int().min(1024).max(4_294_967_296).default(67_108_864),
    /**
     * Largest answer to a request with an `Idempotency-Key`: such an answer is collected whole
     * to be stored for replays; a larger one is 502 and its outcome unknown. @default 1048576 (1 MiB)
     */
    maxStoredResponseBytes: z.coerce.number().int().min(1024).max(16_777_216).default(1_048_576),
    /**
     * How long the outcome of a passthrough request sent with an `Idempotency-Key` is kept for
     * replays and conflicts: shorter than an order's, since any allowed call may store one.
     * @default 3600 (1 h)
     */
    idempotencyTtlSeconds: seconds(60, 30 * 86_400).default(3600),
    /**
     * Most passthrough `Idempotency-Key` records one caller may hold per client at once; past
     * it a keyed request is refused (429 `idempotency_records_exceeded`, nothing sent) until its
     * oldest record expires. `0`: no bound. @default 10000
     */
    maxIdempotencyRecordsPerCaller: z.coerce.number().int().min(0).max(10_000_000).default(10_000),
    /** Requests per second per client, all callers together, fleet-wide (per replica without Redis); `0`: no limit. @default 100 */
    clientRatePerSecond: z.coerce.number().int().min(0).max(100_000).default(100),
    /** Extra requests per client allowed above its rate within any 10-second window. @default 200 */
    clientRateBurst: z.coerce.number().int().min(0).max(1_000_000).default(200),
    /** Requests per second per (client, caller), fleet-wide; `0`: no limit. @default 50 */
    callerRatePerSecond: z.coerce.number().int().min(0).max(100_000).default(50),
    /** Extra requests per (client, caller) allowed above its rate within any 10-second window. @default 100 */
    callerRateBurst: z.coerce.number().int().min(0).max(1_000_000).default(100),
  })
  .strict();
export type ForwardSettings = z.infer<typeof forwardSettingsSchema>;
// --- end provider passthrough ---

/** The Redis topologies the broker speaks, each through ioredis's own support. */
export const REDIS_MODES = ['standalone', 'sentinel', 'cluster'] as const;
export type RedisMode = (typeof REDIS_MODES)[number];

/** `host:port`, with an IPv6 host in brackets (`[::1]:6379`). */
const hostPort = z
  .string()
  .trim()
  .regex(/^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d{1,5}$/, {
    message: 'must be host:port (an IPv6 host in brackets)',
  })
  // Only judged once the shape is right, so a bad entry gets one message, not two.
  .refine((v) => !/:\d+$/.test(v) || Number(v.slice(v.lastIndexOf(':') + 1)) <= 65_535, {
    message: 'port must be 1-65535',
  });

/** A list of `host:port`, also accepted comma-separated (the environment variable form). */
const hostPortList = z.preprocess(
  (v) =>
    typeof v === 'string'
      ? v
          .split(',')
          .map((s) => s.trim())
          .filter((s) => s !== '')
      : v,
  z.array(hostPort).min(1, { message: 'list at least one host:port' }),
);

export const redisSentinelSchema = z
  .object({
    /** Sentinel addresses (`host:port`, port usually 26379). Required in mode `sentinel`. */
    nodes: hostPortList.optional(),
    /** The master group name the sentinels monitor (`sentinel monitor <name> ...`). Required in mode `sentinel`. */
    masterName: z.string().min(1).optional(),
    /** ACL user for the sentinels themselves (`SENTINEL` ACL). @default undefined (no user) */
    username: z.string().min(1).optional(),
    /** Password for the sentinels (`requirepass` of the sentinel processes). @default undefined (none) */
    password: credentialsSourceSchema.optional(),
  })
  .strict();

export const redisClusterSchema = z
  .object({
    /**
     * Seed nodes (`host:port`), or the one configuration endpoint of a managed cluster
     * (ElastiCache cluster mode, MemoryDB): ioredis discovers every node from `CLUSTER SLOTS`.
     * Required in mode `cluster`.
     */
    nodes: hostPortList.optional(),
  })
  .strict();

export const redisTlsSchema = z
  .object({
    /** TLS to Redis (and to the sentinels in mode `sentinel`). A `rediss://` URL turns it on. @default false */
    enabled: flag.default(false),
    /** PEM bundle of the CA(s) that signed the server certificate. @default undefined (the system trust store) */
    caFile: z.string().min(1).optional(),
    /** PEM client certificate for mutual TLS; needs `keyFile`. @default undefined */
    certFile: z.string().min(1).optional(),
    /** PEM private key of `certFile`. @default undefined */
    keyFile: z.string().min(1).optional(),
    /** Hostname the server certificate must name (and SNI) when it differs from the address dialled. @default undefined (the host dialled) */
    serverName: z.string().min(1).optional(),
  })
  .strict();

export const redisSettingsSchema = z
  .object({
    /** Which topology `url`, `sentinel` or `cluster` describes. @default 'standalone' */
    mode: z.enum(REDIS_MODES).default('standalone'),
    /**
     * `redis://` or `rediss://` URL, mode `standalone` only (e.g. an ElastiCache primary
     * endpoint). Unset in mode `standalone`: in-memory store, single replica only.
     * @default undefined
     */
    url: z
      .string()
      .regex(/^rediss?:\/\/[^\s]+$/, { message: 'must be a redis:// or rediss:// URL' })
      .optional(),
    sentinel: redisSentinelSchema.prefault({}),
    cluster: redisClusterSchema.prefault({}),
    /** ACL user for the data nodes. @default undefined (the `default` user) */
    username: z.string().min(1).optional(),
    /** Password of `username` (or `requirepass`), read at start-up. @default undefined (none) */
    password: credentialsSourceSchema.optional(),
    tls: redisTlsSchema.prefault({}),
    /** Every Redis command fails after this long, so no request queues behind a dead link. @default 500 */
    commandTimeoutMs: millis(20, 30_000).default(500),
    /** @default 2000 */
    connectTimeoutMs: millis(50, 60_000).default(2000),
    /** Health ping interval; also how soon a returning Redis is noticed. @default 1000 */
    pingIntervalMs: millis(50, 60_000).default(1000),
  })
  .strict()
  .superRefine((r, ctx) => {
    const issue = (path: (string | number)[], message: string) =>
      ctx.addIssue({ code: 'custom', path, message });
    if (r.mode !== 'standalone' && r.url !== undefined) {
      issue(['url'], `only in mode "standalone"; mode "${r.mode}" finds its nodes itself`);
    }
    if (r.mode === 'sentinel') {
      if (r.sentinel.nodes === undefined)
        issue(['sentinel', 'nodes'], 'required in mode "sentinel"');
      if (r.sentinel.masterName === undefined) {
        issue(['sentinel', 'masterName'], 'required in mode "sentinel"');
      }
    } else {
      // A sentinel list with the mode left at standalone would silently use memory instead.
      for (const field of ['nodes', 'masterName', 'username', 'password'] as const) {
        if (r.sentinel[field] !== undefined) {
          issue(['sentinel', field], 'only in mode "sentinel"; set the mode to "sentinel"');
        }
      }
    }
    if (r.mode === 'cluster') {
      if (r.cluster.nodes === undefined) issue(['cluster', 'nodes'], 'required in mode "cluster"');
    } else if (r.cluster.nodes !== undefined) {
      issue(['cluster', 'nodes'], 'only in mode "cluster"; set the mode to "cluster"');
    }
    if (!redisConfigured(r)) {
      for (const field of ['username', 'password'] as const) {
        if (r[field] !== undefined)
          issue([field], 'set only with a Redis (url, sentinel or cluster)');
      }
    }
    if ((r.tls.certFile === undefined) !== (r.tls.keyFile === undefined)) {
      issue(
        ['tls', r.tls.certFile === undefined ? 'certFile' : 'keyFile'],
        'set the client certificate and its key together (certFile and keyFile)',
      );
    }
    const tlsOn = r.tls.enabled || r.url?.startsWith('rediss://') === true;
    if (!tlsOn) {
      for (const field of ['caFile', 'certFile', 'keyFile', 'serverName'] as const) {
        if (r.tls[field] !== undefined) {
          issue(
            ['tls', field],
            'has no effect without TLS: turn tls.enabled on (or use rediss://)',
          );
        }
      }
    }
  })
  // `rediss://` means TLS: one flag for the connection factory to read.
  .transform((r) =>
    r.url?.startsWith('rediss://') ? { ...r, tls: { ...r.tls, enabled: true } } : r,
  );

/**
 * Whether the broker uses Redis at all: any Sentinel or Cluster, or a standalone URL. Without
 * one the stores live in process memory (single replica only).
 */
export function redisConfigured(settings: { mode: RedisMode; url?: string | undefined }): boolean {
  return settings.mode !== 'standalone' || settings.url !== undefined;
}

/**
 * The admin listener's port: `adminPort`, else the deprecated `metricsPort`; `undefined` when
 * one listener serves everything.
 */
export function adminPortOf(http: {
  adminPort?: number | undefined;
  metricsPort?: number | undefined;
}): number | undefined {
  return http.adminPort ?? http.metricsPort;
}

export const httpSettingsSchema = z
  .object({
    /** @default 8080 */
    port: z.coerce.number().int().min(0).max(65_535).default(8080),
    /** @default '0.0.0.0' */
    host: z.string().min(1).default('0.0.0.0'),
    /**
     * On SIGTERM, how long the replica keeps serving (answering readiness 503 and every request
     * with `Connection: close`) before it stops accepting connections: the time the endpoints
     * controller and kube-proxy need to stop sending it traffic. @default 0
     */
    shutdownDrainDelayMs: millis(0, 120_000).default(0),
    /** Grace period for in-flight requests once the listener stops. @default 10000 */
    shutdownGraceMs: millis(0, 300_000).default(10_000),
    /** Most time to receive a request's line and headers (slowloris): then 408 and close. @default 10000 */
    headersTimeoutMs: millis(500, 120_000).default(10_000),
    /** Most time to receive a whole request, body included: then 408 and close. @default 30000 */
    requestTimeoutMs: millis(500, 300_000).default(30_000),
    /**
     * The admin listener: `/metrics`, `/health/*` and `/admin/*` on their own port, so that a
     * NetworkPolicy admits Prometheus, the kubelet and operators there and keeps callers out.
     * `port` then answers 404 for `/metrics` and `/admin/*` (it keeps `/health/*`: plain
     * `docker run` and probes written for one port keep working). Unset: one listener serves
     * everything (local development, the sandbox).
     */
    adminPort: z.coerce.number().int().min(1).max(65_535).optional(),
    /**
     * Deprecated alias of {@link adminPort} (`METRICS_PORT`, which served `/metrics` alone):
     * taken as the admin port when `adminPort` is unset, with a warning at start-up.
     */
    metricsPort: z.coerce.number().int().min(1).max(65_535).optional(),
    /** How long an idle keep-alive connection stays open. @default 5000 */
    keepAliveTimeoutMs: millis(100, 600_000).default(5000),
    /**
     * The broker's OAuth issuer (`OAUTH_ISSUER`): the origin callers reach it at, e.g.
     * `https://token-broker.shop.svc`, from which the RFC 8414 metadata builds its URLs. Set it
     * wherever the Host header is not trusted: otherwise any caller picks the URLs it is sent.
     * @default the request's origin (scheme and Host)
     */
    issuer: httpUrl
      .refine((v) => !/[?#]/.test(v), { message: 'must have no query or fragment (RFC 8414)' })
      .optional(),
  })
  .strict()
  .refine((h) => h.metricsPort === undefined || h.metricsPort !== h.port, {
    message: 'metricsPort (METRICS_PORT) must differ from port (PORT)',
    path: ['metricsPort'],
  })
  .refine((h) => h.adminPort === undefined || h.adminPort !== h.port, {
    message: 'adminPort (ADMIN_PORT) must differ from port (PORT)',
    path: ['adminPort'],
  })
  .refine(
    (h) =>
      h.adminPort === undefined || h.metricsPort === undefined || h.adminPort === h.metricsPort,
    {
      message:
        'metricsPort (METRICS_PORT) is the deprecated name of adminPort (ADMIN_PORT): set ADMIN_PORT only',
      path: ['metricsPort'],
    },
  )
  .refine((h) => h.headersTimeoutMs <= h.requestTimeoutMs, {
    message:
      'headersTimeoutMs (HTTP_HEADERS_TIMEOUT_MS) must not exceed requestTimeoutMs (HTTP_REQUEST_TIMEOUT_MS)',
    path: ['headersTimeoutMs'],
  });

export const logSettingsSchema = z
  .object({
    /** @default 'info' */
    level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  })
  .strict();

/**
 * The token audit trail: who received which token, when and how often (see docs/security.md,
 * "Audit trail").
 */
export const auditSettingsSchema = z
  .object({
    /**
     * Issued tokens are written as one line per caller, client and token fingerprint per this
     * many seconds, with the count, the first and last time and a few request ids. @default 10
     */
    intervalSeconds: seconds(1, 3600).default(10),
    /** One line per token handed out (with its request id) instead of one per interval. @default false */
    perRequest: flag.default(false),
    /**
     * Refusals (401, 403, 404, bad input) are one line each, at most this many a second; the
     * rest are counted in a later `token refusals suppressed` line. @default 100
     */
    refusalsPerSecond: z.coerce.number().int().min(1).max(1_000_000).default(100),
  })
  .strict();

/** Client ids a caller may use; `"*"` grants every configured client. */
const clientGrantSchema = z
  .array(
    z.string().refine((v) => v === '*' || CLIENT_ID_PATTERN.test(v), {
      message: 'must be a client id or "*"',
    }),
  )
  .min(1, { message: 'grant at least one client (or "*" for all)' });

/**
 * What a caller may do besides choosing clients:
 * - `token`: read the provider token (`GET /token`, `POST /oauth2/token`);
 * - `forward`: have the broker call the provider for it (`POST /orders`, the provider
 *   passthrough) without ever seeing the token;
 * - `admin`: the admin routes on the admin listener.
 */
export const CALLER_SCOPES = ['token', 'forward', 'admin'] as const;
export type CallerScope = (typeof CALLER_SCOPES)[number];
/** What a grant without `scopes` allows: everything a merchant service did before scopes. */
export const DEFAULT_CALLER_SCOPES: readonly CallerScope[] = ['token', 'forward'];

const callerScopesSchema = z
  .array(z.enum(CALLER_SCOPES, { message: 'must be "token", "forward" or "admin"' }))
  .min(1, { message: 'grant at least one scope ("token", "forward", "admin")' })
  .transform((scopes) => [...new Set(scopes)]);

/** One API key, stored only as its SHA-256: the broker never holds the key itself. */
export const apiKeyGrantSchema = z
  .object({
    /** The caller's name in audit lines and 403 messages, e.g. the service's name. */
    name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$/, {
      message: 'must be 1-128 letters, digits or "._:@/-"',
    }),
    /** Hex SHA-256 of the key exactly as callers send it: `printf %s "$KEY" | sha256sum`. */
    sha256: z
      .string()
      .regex(/^[0-9a-fA-F]{64}$/, {
        message: "must be the 64 hex digits of the key's SHA-256, never the key itself",
      })
      .transform((v) => v.toLowerCase()),
    /** Client ids this key may use; `"*"` for every client. */
    clients: clientGrantSchema,
    /** What this key may do with those clients; a proxy-only caller has `["forward"]`. @default ["token", "forward"] */
    scopes: callerScopesSchema.default([...DEFAULT_CALLER_SCOPES]),
  })
  .strict();
export type ApiKeyGrant = z.infer<typeof apiKeyGrantSchema>;

/** A list of API key grants (inline in the config file, or the JSON of a secret). */
export const apiKeyGrantListSchema = z.array(apiKeyGrantSchema).superRefine((keys, ctx) => {
  const seen = new Set<string>();
  keys.forEach((k, i) => {
    if (seen.has(k.sha256)) {
      ctx.addIssue({
        code: 'custom',
        path: [i, 'sha256'],
        message: 'the same key is listed twice',
      });
    }
    seen.add(k.sha256);
  });
});

/** `system:serviceaccount:<namespace>:<name>`, as Kubernetes writes a projected token's `sub`. */
export const SERVICE_ACCOUNT_SUBJECT =
  /^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

/**
 * `CALLER_AUTH_SUBJECTS` holds the same JSON object as the file's `subjects`. A comma list of
 * subjects is refused rather than read: it names no clients, and a grant is never widened to
 * every client implicitly.
 */
function subjectsFromEnvironment(value: unknown, ctx: z.core.$RefinementCtx): unknown {
  if (typeof value !== 'string') return value;
  const example =
    '{"system:serviceaccount:<namespace>:<name>": {"clients": ["<client id>"], "scopes": ["token"]}}';
  if (!value.trim().startsWith('{')) {
    ctx.addIssue({
      code: 'custom',
      message: `must be a JSON object granting each service account its clients, e.g. ${example} (a list of subjects alone names no clients)`,
    });
    return z.NEVER;
  }
  try {
    return JSON.parse(value) as unknown;
  } catch {
    ctx.addIssue({ code: 'custom', message: `must be valid JSON, e.g. ${example}` });
    return z.NEVER;
  }
}

/**
 * A service account's grant: the clients it may use (a list, with the default scopes) or
 * `{"clients": [...], "scopes": [...]}`; always the object form once parsed.
 */
const subjectGrantSchema = z.preprocess(
  (v) => (Array.isArray(v) ? { clients: v } : v),
  z
    .object({
      clients: clientGrantSchema,
      scopes: callerScopesSchema.default([...DEFAULT_CALLER_SCOPES]),
    })
    .strict(),
);
export type SubjectGrant = z.infer<typeof subjectGrantSchema>;

export const kubernetesCallerAuthSchema = z
  .object({
    /**
     * JWKS URL of the cluster's service-account token issuer: the issuer's public discovery
     * endpoint (EKS/GKE/AKS publish one), or `https://kubernetes.default.svc/openid/v1/jwks`
     * in-cluster. Keys are cached and refetched (rate limited) when a token names an unknown
     * `kid`. Required in mode `kubernetes`.
     */
    jwksUrl: httpUrl.optional(),
    /** The `iss` every token must carry (the API server's `--service-account-issuer`). Required in mode `kubernetes`. */
    issuer: z.string().min(1).optional(),
    /** The `aud` every token must carry: the `audience` of the callers' projected token volume. @default 'token-broker' */
    audience: z.string().min(1).default('token-broker'),
    /**
     * Service-account subject to the clients it may use, e.g. `{"system:serviceaccount:shop:checkout": ["acme-prod"]}`,
     * or to `{"clients": [...], "scopes": [...]}` to choose its scopes (see `CALLER_SCOPES`).
     * `CALLER_AUTH_SUBJECTS` takes the same object as JSON. @default {}
     */
    subjects: z
      .preprocess(
        subjectsFromEnvironment,
        z.record(z.string(), subjectGrantSchema).superRefine((subjects, ctx) => {
          for (const subject of Object.keys(subjects)) {
            if (!SERVICE_ACCOUNT_SUBJECT.test(subject)) {
              ctx.addIssue({
                code: 'custom',
                path: [subject],
                message: 'must be system:serviceaccount:<namespace>:<name>',
              });
            }
          }
        }),
      )
      .default({}),
    /** Verified tokens are cached by their SHA-256 until they expire; at most this many. @default 10000 */
    cacheSize: z.coerce.number().int().min(1).max(1_000_000).default(10_000),
    /** Leeway for `exp`/`nbf` against clock skew. @default 5 */
    clockToleranceSeconds: seconds(0, 300).default(5),
    /**
     * Longest lifetime (`exp` - `iat`) of a token accepted; tokens without `iat` are refused.
     * A verified token is trusted until it expires, so a year-long token (a legacy Secret
     * token, or a stolen one) must not be. Projected volumes ask for an hour by default.
     * @default 172800 (48 h)
     */
    maxTokenLifetimeSeconds: seconds(60, 31_536_000).default(172_800),
  })
  .strict();

/** The ways a caller can authenticate. `none` is for local development only. */
export const CALLER_AUTH_MODES = ['api-key', 'kubernetes', 'none'] as const;
export type CallerAuthMode = (typeof CALLER_AUTH_MODES)[number];

export const callerAuthSettingsSchema = z
  .object({
    /**
     * How callers authenticate on every route but health and metrics. No default: a broker
     * hands out credentials that spend the merchant's money, so the operator must choose.
     */
    mode: z
      // Absent becomes '' so the check below reports it without aborting the other checks:
      // one run of the broker should list every bad setting, not one at a time.
      .preprocess((v) => v ?? '', z.string())
      .superRefine((v, ctx) => {
        if ((CALLER_AUTH_MODES as readonly string[]).includes(v)) return;
        ctx.addIssue({
          code: 'custom',
          message:
            v === ''
              ? 'required: choose "api-key", "kubernetes", or "none" (local development only)'
              : 'must be "api-key", "kubernetes" or "none"',
        });
      })
      .transform((v) => v as CallerAuthMode),
    /**
     * Must be `true` for mode `none`, which is refused outright in production (any `NODE_ENV`
     * but `development` or `test`) and on any `HOST` but loopback. @default false
     */
    allowNone: flag.default(false),
    /** Mode `api-key`: grants listed in the config file (hashes only). */
    apiKeys: apiKeyGrantListSchema.optional(),
    /** Mode `api-key`: a secret (or file) holding the same JSON list; merged with `apiKeys`. */
    apiKeysSource: credentialsSourceSchema.optional(),
    /** Re-read `apiKeysSource` this often so grants and revocations need no restart; 0 turns it off. @default 300 */
    apiKeysReloadSeconds: seconds(0, 86_400).default(300),
    kubernetes: kubernetesCallerAuthSchema.prefault({}),
  })
  .strict();
export type CallerAuthSettings = z.infer<typeof callerAuthSettingsSchema>;

export const cacheEncryptionSchema = z
  .object({
    /**
     * Secret (or file) holding the AES-256 key for the token in Redis: one base64 32-byte key
     * (`openssl rand -base64 32`), or `{"current": "<base64>", "previous": ["<base64>", ...]}`
     * to rotate (read with every key, write with `current`). Unset: the token is stored in
     * clear, with a warning; refused in production (any `NODE_ENV` but `development` or
     * `test`) when Redis is configured.
     */
    key: credentialsSourceSchema.optional(),
  })
  .strict();

/** The whole validated configuration, as injected under `BROKER_CONFIG`. */
export const brokerConfigSchema = z
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
    /**
     * `NODE_ENV`; anything but `development` or `test` (`production`, `Production`, `prod`...)
     * is production, where development conveniences (no caller auth, clear cache) are errors.
     * @default 'development'
     */
    nodeEnv: z.string().min(1).default('development'),
    // Parsed even when absent, so a missing section reports the missing mode by its name.
    callerAuth: z.preprocess((v) => v ?? {}, callerAuthSettingsSchema),
    cacheEncryption: cacheEncryptionSchema.default({}),
  })
  .strict()
  .superRefine((cfg, ctx) => refineSecurity(cfg, ctx))
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
    if (cfg.token.minRefreshIntervalMs + 1000 > cfg.token.defaultLifetimeSeconds * 1000) {
      ctx.addIssue({
        code: 'custom',
        path: ['token', 'minRefreshIntervalMs'],
        message:
          'must be at least 1 s shorter than token.defaultLifetimeSeconds: tokens of that lifetime could not be served between two refreshes',
      });
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

/** Whether a listen address only accepts connections from this machine. */
export function isLoopbackHost(host: string): boolean {
  if (host === 'localhost') return true;
  const family = isIP(host);
  return family !== 0 && LOOPBACK.check(host, family === 4 ? 'ipv4' : 'ipv6');
}

/** Cross-field checks of caller authentication and cache encryption. */
function refineSecurity(
  cfg: {
    nodeEnv: string;
    http: { host: string };
    clients: readonly { id: string }[];
    redis: { mode: RedisMode; url?: string };
    callerAuth: CallerAuthSettings;
    cacheEncryption: { key?: unknown };
  },
  ctx: z.RefinementCtx,
): void {
  const issue = (path: (string | number)[], message: string) =>
    ctx.addIssue({ code: 'custom', path, message });
  const production = !isDevelopmentEnv(cfg.nodeEnv);
  const auth = cfg.callerAuth;
  switch (auth.mode) {
    case 'none':
      if (production) {
        issue(
          ['callerAuth', 'mode'],
          '"none" is refused unless NODE_ENV is "development" or "test"; use "api-key" or "kubernetes"',
        );
        break;
      }
      // Decided by where the broker listens, not by NODE_ENV alone: anyone who can connect
      // could take the merchants' tokens.
      if (!isLoopbackHost(cfg.http.host)) {
        issue(
          ['callerAuth', 'mode'],
          '"none" listens on loopback only: set HOST (http.host) to 127.0.0.1, ::1 or localhost, or use "api-key" or "kubernetes"',
        );
      }
      if (!auth.allowNone) {
        issue(
          ['callerAuth', 'allowNone'],
          'must be true to turn caller authentication off (mode "none", local development only)',
        );
      }
      break;
    case 'api-key':
      if (auth.apiKeys === undefined && auth.apiKeysSource === undefined) {
        issue(
          ['callerAuth', 'apiKeysSource'],
          'required in mode "api-key" (or list callerAuth.apiKeys in the config file)',
        );
      }
      break;
    case 'kubernetes':
      if (auth.kubernetes.jwksUrl === undefined) {
        issue(['callerAuth', 'kubernetes', 'jwksUrl'], 'required in mode "kubernetes"');
      }
      if (auth.kubernetes.issuer === undefined) {
        issue(['callerAuth', 'kubernetes', 'issuer'], 'required in mode "kubernetes"');
      }
      if (Object.keys(auth.kubernetes.subjects).length === 0) {
        issue(
          ['callerAuth', 'kubernetes', 'subjects'],
          'grant at least one service account in mode "kubernetes"',
        );
      }
      break;
  }
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

/**
 * The whole of one token request, connect to last byte. Undici's body timeout is an idle timer
 * that a server sending a byte now and then never trips, so the call also has this one deadline.
 */
export function tokenCallDeadlineMs(provider: ProviderSettings): number {
  return provider.connectTimeoutMs + provider.responseTimeoutMs;
}

/**
 * The whole of one checkout or passthrough call, connect to last byte: the sum of its three
 * timeouts, enforced as one deadline (see {@link tokenCallDeadlineMs}). Idempotency leases are
 * sized from it.
 */
export function ordersCallDeadlineMs(orders: OrdersSettings): number {
  return orders.connectTimeoutMs + orders.headersTimeoutMs + orders.bodyTimeoutMs;
}
