import { z } from 'zod';
import { CLIENT_ID_PATTERN, credentialsSourceSchema, forwardRuleSchema } from './client.schema';
import { flag, httpUrl, int, issuesOf } from './schema-parts';

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

/**
 * A caller's own allow-list, on top of each client's (`clients[].forward.allow`): a call is
 * forwarded for it only when both let the method and path pass; `POST /orders` counts as `POST`
 * on the client's `ordersPath`. Absent: the clients' allow-lists alone.
 */
const callerForwardAllowSchema = z
  .array(forwardRuleSchema)
  .min(1, { message: 'list at least one rule, or take scope "forward" away from this caller' });

/** A narrowing of what the caller may forward means nothing without scope `forward`. */
function checkForwardAllow(
  grant: { scopes: readonly CallerScope[]; forwardAllow?: unknown },
  ctx: z.core.$RefinementCtx,
): void {
  if (grant.forwardAllow !== undefined && !grant.scopes.includes('forward')) {
    issuesOf(ctx)(['forwardAllow'], 'only with scope "forward": it narrows what may be forwarded');
  }
}

const callerScopesSchema = z
  .array(z.enum(CALLER_SCOPES, { message: 'must be "token", "forward" or "admin"' }))
  .min(1, { message: 'grant at least one scope ("token", "forward", "admin")' })
  .transform((scopes) => [...new Set(scopes)]);

/** `sha256("")`. */
const EMPTY_KEY_SHA256 = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';

/** One API key, stored only as its SHA-256: the broker never holds the key itself. */
const apiKeyGrantSchema = z
  .object({
    name: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$/, {
        message: 'must be 1-128 letters, digits or "._:@/-"',
      })
      .meta({
        description: "The caller's name in audit lines and 403 messages, e.g. the service's name.",
      }),
    sha256: z
      .string()
      .regex(/^[0-9a-fA-F]{64}$/, {
        message: "must be the 64 hex digits of the key's SHA-256, never the key itself",
      })
      .transform((v) => v.toLowerCase())
      // What `printf %s "$key" | sha256sum` prints when `$key` is unset: it would let in any
      // caller sending an empty key.
      .refine((v) => v !== EMPTY_KEY_SHA256, {
        message:
          'is the SHA-256 of an empty key (the key variable was empty when it was hashed); generate a key with `openssl rand -hex 32` and hash that',
      })
      .meta({
        description:
          'Hex SHA-256 of the key exactly as callers send it: `printf %s "$KEY" | sha256sum`.',
      }),
    clients: clientGrantSchema.meta({
      description: 'Client ids this key may use; `"*"` for every client.',
    }),
    scopes: callerScopesSchema.default([...DEFAULT_CALLER_SCOPES]).meta({
      description:
        'What this key may do with those clients; a proxy-only caller has `["forward"]`.',
    }),
    forwardAllow: callerForwardAllowSchema.optional().meta({
      description:
        'Narrows what this key may forward, e.g. `[{"methods": ["GET"], "prefix": ' +
        '"/api/marketing/v1/"}]`: a call passes only when one of these rules and the client\'s ' +
        "`forward.allow` both let it (`POST /orders` is `POST` on the client's `ordersPath`).",
      defaultText: "the clients' allow-lists alone",
    }),
  })
  .strict()
  .superRefine(checkForwardAllow);
export type ApiKeyGrant = z.infer<typeof apiKeyGrantSchema>;

/** A list of API key grants (inline in the config file, or the JSON of a secret). */
export const apiKeyGrantListSchema = z.array(apiKeyGrantSchema).superRefine((keys, ctx) => {
  const seen = new Set<string>();
  keys.forEach((k, i) => {
    if (seen.has(k.sha256)) {
      issuesOf(ctx)([i, 'sha256'], 'the same key is listed twice');
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
      forwardAllow: callerForwardAllowSchema
        .optional()
        .meta({ description: "As an API key's `forwardAllow`." }),
    })
    .strict()
    .superRefine(checkForwardAllow),
);
export type SubjectGrant = z.infer<typeof subjectGrantSchema>;

const kubernetesCallerAuthSchema = z
  .object({
    jwksUrl: httpUrl.optional().meta({
      description:
        "JWKS URL of the cluster's service-account token issuer: the issuer's public discovery " +
        'endpoint (EKS/GKE/AKS publish one), or `https://kubernetes.default.svc/openid/v1/jwks` ' +
        'in-cluster. Keys are cached and refetched (rate limited) when a token names an unknown ' +
        '`kid`. Required in mode `kubernetes`.',
      env: 'CALLER_AUTH_JWKS_URL',
    }),
    issuer: z
      .string()
      .min(1)
      .optional()
      .meta({
        description:
          "The `iss` every token must carry (the API server's " +
          '`--service-account-issuer`). Required in mode `kubernetes`.',
        env: 'CALLER_AUTH_ISSUER',
      }),
    audience: z
      .string()
      .min(1)
      .default('token-broker')
      .meta({
        description:
          "The `aud` every token must carry: the `audience` of the callers' " +
          'projected token volume. Set one per broker: brokers of a cluster trust ' +
          'the same issuer, so with a shared audience each accepts the tokens ' +
          'made for the others (the Helm chart sets `<fullname>.<namespace>`).',
        env: 'CALLER_AUTH_AUDIENCE',
      }),
    subjects: z
      .preprocess(
        subjectsFromEnvironment,
        z.record(z.string(), subjectGrantSchema).superRefine((subjects, ctx) => {
          for (const subject of Object.keys(subjects)) {
            if (!SERVICE_ACCOUNT_SUBJECT.test(subject)) {
              issuesOf(ctx)([subject], 'must be system:serviceaccount:<namespace>:<name>');
            }
          }
        }),
      )
      .default({})
      .meta({
        description:
          'Service-account subject to the clients it may use, e.g. ' +
          '`{"system:serviceaccount:shop:checkout": ["acme-prod"]}`, or to `{"clients": ' +
          '[...], "scopes": [...], "forwardAllow": [...]}` to choose its scopes (see ' +
          "`CALLER_SCOPES`) and narrow what it may forward (as an API key's " +
          '`forwardAllow`). `CALLER_AUTH_SUBJECTS` takes the same object as JSON.',
        env: 'CALLER_AUTH_SUBJECTS',
      }),
    cacheSize: int(1, 1_000_000).default(10_000).meta({
      description:
        'Verified tokens are cached by their SHA-256 until they expire; at most this many.',
    }),
    clockToleranceSeconds: int(0, 300)
      .default(5)
      .meta({ description: 'Leeway for `exp`/`nbf` against clock skew.' }),
    maxTokenLifetimeSeconds: int(60, 31_536_000)
      .default(172_800)
      .meta({
        description:
          'Longest lifetime (`exp` - `iat`) of a token accepted; tokens without `iat` are refused. ' +
          'A verified token is trusted until it expires, so a year-long token (a legacy Secret ' +
          'token, or a stolen one) must not be. Projected volumes ask for an hour by default.',
        defaultText: '172800 (48 h)',
        env: 'CALLER_AUTH_MAX_TOKEN_LIFETIME_SECONDS',
      }),
  })
  .strict();

/** The ways a caller can authenticate. `none` is for local development only. */
const CALLER_AUTH_MODES = ['api-key', 'kubernetes', 'none'] as const;
export type CallerAuthMode = (typeof CALLER_AUTH_MODES)[number];

export const callerAuthSettingsSchema = z
  .object({
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
      .transform((v) => v as CallerAuthMode)
      .meta({
        description:
          'How callers authenticate on every route but health and metrics. No default: a broker ' +
          "hands out credentials that spend the merchant's money, so the operator must choose.",
        env: 'CALLER_AUTH_MODE',
      }),
    allowNone: flag.default(false).meta({
      description:
        'Must be `true` for mode `none`, which is refused outright in production (any ' +
        '`NODE_ENV` but `development` or `test`) and on any `HOST` but loopback.',
      env: 'CALLER_AUTH_ALLOW_NONE',
    }),
    apiKeys: apiKeyGrantListSchema
      .optional()
      .meta({ description: 'Mode `api-key`: grants listed in the config file (hashes only).' }),
    apiKeysSource: credentialsSourceSchema.optional().meta({
      description:
        'Mode `api-key`: a secret (or file) holding the same JSON list; merged with `apiKeys`.',
      envFields: { secretId: 'CALLER_API_KEYS_SECRET_ID', file: 'CALLER_API_KEYS_FILE' },
    }),
    apiKeysReloadSeconds: int(0, 86_400)
      .default(300)
      .meta({
        description:
          'Re-read `apiKeysSource` this often so grants and ' +
          'revocations need no restart; 0 turns it off.',
        env: 'CALLER_API_KEYS_RELOAD_SECONDS',
      }),
    kubernetes: kubernetesCallerAuthSchema.prefault({}),
  })
  .strict();
export type CallerAuthSettings = z.infer<typeof callerAuthSettingsSchema>;
