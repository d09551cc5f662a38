import { z } from 'zod';
import { commaList, exactHttpUrl, flag, httpUrl, int, issuesOf } from './schema-parts';
import { filePathSchema, secretIdSchema } from './secret-reference';

export const CLIENT_ID_PATTERN = /^[a-z0-9][a-z0-9._-]{0,62}$/;

const path = z
  .string()
  .regex(/^\/[A-Za-z0-9._~!$&'()*+,;=:@/%-]*$/, { message: 'must be an absolute URL path' });

/** The two places a credentials JSON is read from, shared by every credentials reference. */
const jsonSourceFields = {
  secretId: secretIdSchema.optional().meta({
    description:
      "AWS Secrets Manager secret name or ARN. Region/endpoint come from the AWS SDK's env.",
  }),
  file: filePathSchema.optional().meta({
    description: 'A file holding the same JSON (local development, or a Secrets Store CSI mount).',
  }),
};

/**
 * Where a client's `{"client_id","client_secret"}` JSON is read from: exactly one source. Each
 * must have a reference's shape (a secret name or ARN, a file path): it is printed in messages.
 */
export const credentialsSourceSchema = z
  .object(jsonSourceFields)
  .strict()
  .refine((c) => (c.secretId === undefined) !== (c.file === undefined), {
    message: 'set exactly one of secretId or file',
  });
export type CredentialsSource = z.infer<typeof credentialsSourceSchema>;

/**
 * Where a client's credentials are read from: the JSON from Secrets Manager or a file, or, for
 * the key-based methods, PEM files as a Kubernetes TLS Secret holds them (`tls.crt`, `tls.key`).
 */
const clientCredentialsSourceSchema = z
  .object({
    ...jsonSourceFields,
    clientId: z.string().min(1).optional().meta({
      description: 'The client id, with `privateKeyFile` (the files hold only key material).',
      env: 'CREDENTIALS_CLIENT_ID',
    }),
    certificateFile: filePathSchema.optional().meta({
      description:
        'PEM client certificate (chain) file for `tls_client_auth` and ' +
        '`self_signed_tls_client_auth`, e.g. a mounted `tls.crt`.',
      env: 'CREDENTIALS_CERTIFICATE_FILE',
    }),
    privateKeyFile: filePathSchema.optional().meta({
      description:
        'PEM (or JWK) private key file for `private_key_jwt` and the mutual-TLS methods, ' +
        'e.g. `tls.key`.',
      env: 'CREDENTIALS_PRIVATE_KEY_FILE',
    }),
  })
  .strict()
  .superRefine((c, ctx) => {
    const issue = issuesOf(ctx);
    const kinds = [c.secretId, c.file, c.privateKeyFile].filter((v) => v !== undefined).length;
    if (kinds !== 1 && c.privateKeyFile !== undefined) {
      issue(
        ['privateKeyFile'],
        'key files replace the JSON: set privateKeyFile, secretId or file, one only',
      );
    } else if (kinds !== 1) {
      issue(
        [],
        'set exactly one of secretId or file (the credentials JSON), or privateKeyFile with clientId (key files)',
      );
    }
    if (c.privateKeyFile !== undefined && c.clientId === undefined) {
      issue(['clientId'], 'required with privateKeyFile: the key files do not hold the client id');
    }
    for (const field of ['clientId', 'certificateFile'] as const) {
      if (c[field] !== undefined && c.privateKeyFile === undefined) {
        issue([field], 'only with privateKeyFile; a secretId or file holds the client id and keys');
      }
    }
  });
export type ClientCredentialsSource = z.infer<typeof clientCredentialsSourceSchema>;

/** The methods the provider passthrough forwards. */
export const FORWARD_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;
export type ForwardMethod = (typeof FORWARD_METHODS)[number];

/** A path segment that no server reads as anything else: no dots alone, no `;`, no `%`. */
const PLAIN_SEGMENT = "[A-Za-z0-9_~!$&'()*+,=:@-][A-Za-z0-9._~!$&'()*+,=:@-]*";

/** One allow-list rule: these methods on this exact path, or under this path prefix. */
export const forwardRuleSchema = z
  .object({
    methods: z
      .array(z.enum(FORWARD_METHODS))
      .min(1)
      .default([...FORWARD_METHODS])
      .meta({
        description: 'Methods allowed on `path` or under `prefix`.',
        defaultText: 'all six',
      }),
    prefix: z
      .string()
      .regex(new RegExp(`^/(?:${PLAIN_SEGMENT}/)*$`), {
        message:
          'must be an absolute path of plain segments ending in "/" (no "." or ".." segments, no "//", no ";", no percent-encoding), e.g. /api/marketing/v1/',
      })
      .optional()
      .meta({
        description:
          'A provider path prefix ending in `/`, e.g. `/api/marketing/v1/`. ' +
          'Matched against the request path after it was checked for tricks ' +
          '(`..`, `;`, encoded slashes, `//`): no prefix can be escaped, and a ' +
          'prefix holding `;` could never match. One of `prefix` or `path`.',
      }),
    path: z
      .string()
      .regex(new RegExp(`^(?:/${PLAIN_SEGMENT})+/?$`), {
        message:
          'must be an absolute path of plain segments (no "." or ".." segments, no "//", no ";", no percent-encoding), e.g. /api/checkout/v1/orders',
      })
      .optional()
      .meta({
        description:
          'One exact provider path, e.g. `/api/checkout/v1/orders`: that ' +
          'path only, nothing below it. One of `prefix` or `path`.',
      }),
  })
  .strict()
  .refine((r) => (r.prefix === undefined) !== (r.path === undefined), {
    message: 'set exactly one of prefix (a path and everything under it) or path (that path only)',
  });
export type ForwardRule = z.infer<typeof forwardRuleSchema>;

/** Whether `rule` lets `method` on the (checked) `path` pass. */
export function ruleAllows(rule: ForwardRule, method: string, path: string): boolean {
  if (!rule.methods.includes(method as ForwardMethod)) return false;
  return rule.path !== undefined ? path === rule.path : path.startsWith(rule.prefix!);
}

/** The rules as a 403 message lists them: `POST on /a/b; GET, HEAD under /c/`. */
export function describeForwardRules(rules: readonly ForwardRule[]): string {
  if (rules.length === 0) return 'no rules (nothing may be forwarded)';
  return rules
    .map((r) =>
      r.path !== undefined
        ? `${r.methods.join(', ')} on ${r.path}`
        : `${r.methods.join(', ')} under ${r.prefix}`,
    )
    .join('; ');
}

/**
 * What the provider documents (SPEC.md): creating an order (`POST` on the client's
 * `ordersPath`) and reading the marketing API. Anything else on the checkout API (cancelling,
 * refunding, another service's orders) needs a rule of its own.
 */
export function defaultForwardRules(ordersPath: string): ForwardRule[] {
  return [
    { methods: ['POST'], path: ordersPath },
    { methods: ['GET', 'HEAD'], prefix: '/api/marketing/v1/' },
  ];
}

/** What `/provider/<client>/...` may forward for one client. */
const clientForwardSchema = z
  .object({
    allow: z.array(forwardRuleSchema).optional().meta({
      description: 'Rules; a request passes if one rule allows its method and path.',
      defaultText: "POST on the client's ordersPath, GET and HEAD under /api/marketing/v1/",
    }),
  })
  .strict();

/**
 * Which provider 401s on a forwarded call mean the token itself was refused: `invalid_token`
 * only those that say so (`WWW-Authenticate: Bearer error="invalid_token"`, RFC 6750 §3.1, or
 * the `bodyMarker`); `any` every 401.
 */
export const REJECTION_EVIDENCE = ['invalid_token', 'any'] as const;
export type RejectionEvidence = (typeof REJECTION_EVIDENCE)[number];

/**
 * When a provider 401 counts as a refused token (then the broker invalidates it, within the
 * rejection floor and the caller's budget, and retries once with a new one). Any other 401 is
 * relayed as it is: it may come from a reason the caller controls (a wrong one-time code, a
 * missing consent).
 */
const tokenRejectionSchema = z
  .object({
    orders: z.enum(REJECTION_EVIDENCE).optional().meta({
      description: '`POST /orders`.',
      defaultText:
        "'any' with grant `provider-query` (the provider does not document its 401), 'invalid_token' otherwise",
    }),
    forward: z
      .enum(REJECTION_EVIDENCE)
      .default('invalid_token')
      .meta({ description: 'The passthrough.' }),
    bodyMarker: z
      .string()
      .min(1)
      .max(256)
      .optional()
      .meta({
        description:
          "Text whose presence in the first 4 KiB of a 401's body marks a refused token " +
          'too, for a provider that says so in its body, e.g. `"error":"invalid_token"`.',
      }),
  })
  .strict();

/** How a client's token request is shaped on the wire. */
export const TOKEN_GRANTS = ['provider-query', 'rfc6749'] as const;
export type TokenGrant = (typeof TOKEN_GRANTS)[number];

/** How a client authenticates to the token endpoint (RFC 6749 §2.3, RFC 7523, RFC 8705). */
export const CLIENT_AUTH_METHODS = [
  'client_secret_basic',
  'client_secret_post',
  'private_key_jwt',
  'tls_client_auth',
  'self_signed_tls_client_auth',
] as const;
export type ClientAuthMethod = (typeof CLIENT_AUTH_METHODS)[number];

/** RFC 8705 §2: the methods that authenticate with the client certificate in the handshake. */
export function presentsCertificate(auth: ClientAuthMethod): boolean {
  return auth === 'tls_client_auth' || auth === 'self_signed_tls_client_auth';
}

/** Signature algorithms for `private_key_jwt` client assertions. */
const ASSERTION_ALGS = ['RS256', 'ES256', 'PS256', 'EdDSA'] as const;

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

/** How `private_key_jwt` client assertions are signed. */
export const assertionSettingsSchema = z
  .object({
    // Field order is the order the loader names these variables in.
    lifetimeSeconds: int(5, 300).default(60).meta({
      description: 'Assertion lifetime.',
      env: 'TOKEN_REQUEST_ASSERTION_LIFETIME_SECONDS',
    }),
    alg: z.enum(ASSERTION_ALGS).default('RS256').meta({
      description: 'Signature algorithm; must match the key.',
      env: 'TOKEN_REQUEST_ASSERTION_ALG',
    }),
    audience: z
      .enum(['token_endpoint', 'issuer'])
      .default('token_endpoint')
      .meta({
        description:
          'The `aud` claim: the token endpoint the assertion is posted to (RFC 7523), or ' +
          "`issuer`, the authorization server's issuer identifier (`tokenRequest.issuer`), " +
          'which FAPI 2.0 and several servers want.',
        env: 'TOKEN_REQUEST_ASSERTION_AUDIENCE',
      }),
    kid: z.string().min(1).max(256).optional().meta({
      description: '`kid` header, when the server holds several keys for the client.',
      defaultText: "the JWK's own `kid`, if any",
      env: 'TOKEN_REQUEST_ASSERTION_KID',
    }),
  })
  .strict();

/**
 * A client's token request: the provider's own dialect (the default), or a standard RFC 6749
 * client-credentials grant for any other API, with its client authentication method.
 */
const tokenRequestSchema = z
  .object({
    grant: z
      .enum(TOKEN_GRANTS)
      .default('provider-query')
      .meta({
        description:
          "`provider-query`: the provider's dialect (`POST " +
          '{authUrl}/api/auth/v1/oauth/token?grant_type=client_credentials`, ' +
          'HTTP Basic, no body). `rfc6749`: a form-encoded body posted to `url`.',
        env: 'TOKEN_REQUEST_GRANT',
      }),
    url: exactHttpUrl.optional().meta({
      description:
        'The token endpoint, exactly as the authorization server publishes it. With grant ' +
        '`rfc6749`, this or `issuer`; set beside `issuer`, it wins over the metadata.',
      env: 'TOKEN_REQUEST_URL',
    }),
    issuer: exactHttpUrl.optional().meta({
      description:
        "The authorization server's issuer identifier: at start the broker reads its RFC 8414 " +
        'metadata (`/.well-known/oauth-authorization-server`, then ' +
        '`/.well-known/openid-configuration`), whose `issuer` must equal this, and takes the ' +
        'token endpoint from it (its `mtls_endpoint_aliases` one for the mutual-TLS methods), ' +
        'refusing an `auth` or `assertion.alg` the server does not list. Re-read every ' +
        '`PROVIDER_METADATA_REFRESH_SECONDS`. Grant `rfc6749` only.',
      env: 'TOKEN_REQUEST_ISSUER',
    }),
    auth: z
      .enum(CLIENT_AUTH_METHODS)
      .default('client_secret_basic')
      .meta({
        description:
          'Client authentication: `client_secret_basic` or `client_secret_post` ' +
          '(credentials hold `client_secret`), `private_key_jwt` (credentials hold ' +
          '`private_key`, PEM or JWK), or `tls_client_auth` / `self_signed_tls_client_auth` ' +
          '(RFC 8705; credentials hold `certificate` and `private_key`, PEM: the certificate ' +
          "is presented to the token endpoint and to `baseUrl`, so the provider's " +
          'certificate-bound tokens work on the passthrough and `POST /orders`). Only ' +
          '`client_secret_basic` with grant `provider-query`.',
        env: 'TOKEN_REQUEST_AUTH',
      }),
    scope: z.string().min(1).optional().meta({
      description: '`scope` to request (space-separated). Grant `rfc6749` only.',
      env: 'TOKEN_REQUEST_SCOPE',
    }),
    audience: z.string().min(1).optional().meta({
      description: '`audience` to request (Auth0, Okta and others). Grant `rfc6749` only.',
      env: 'TOKEN_REQUEST_AUDIENCE',
    }),
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
      .optional()
      .meta({
        description:
          'RFC 8707 resource indicators (absolute URIs); a ' +
          'comma list in the environment. Grant `rfc6749` only.',
        env: 'TOKEN_REQUEST_RESOURCE',
      }),
    params: z
      .preprocess(
        jsonObjectFromEnvironment,
        z.record(z.string().regex(/^[A-Za-z0-9._~-]{1,64}$/), z.string().max(2048)),
      )
      .optional()
      .meta({
        description:
          'Extra form parameters, e.g. `{"tenant": "acme"}`; JSON in the environment. ' +
          'Not for secrets (those live in the credentials). Grant `rfc6749` only.',
        env: 'TOKEN_REQUEST_PARAMS',
      }),
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
      .optional()
      .meta({
        description:
          'Extra request headers, e.g. `{"X-Tenant": "acme"}`; JSON in ' +
          'the environment. Not for secrets. Grant `rfc6749` only.',
        env: 'TOKEN_REQUEST_HEADERS',
      }),
    assertion: assertionSettingsSchema.optional().meta({
      description: 'The `private_key_jwt` client assertion. Auth `private_key_jwt` only.',
      defaultText: 'RS256, 60 s',
    }),
  })
  .strict()
  .superRefine((r, ctx) => {
    const issue = issuesOf(ctx);
    if (r.grant === 'provider-query') {
      for (const field of [
        'url',
        'issuer',
        'scope',
        'audience',
        'resource',
        'params',
        'headers',
      ] as const) {
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
    } else if (r.url === undefined && r.issuer === undefined) {
      issue(
        ['url'],
        'required with grant "rfc6749": the token endpoint URL, or tokenRequest.issuer to read it from the server\'s metadata',
      );
    }
    if (r.assertion !== undefined && r.auth !== 'private_key_jwt') {
      issue(['assertion'], 'only with auth "private_key_jwt"');
    }
    if (r.assertion?.audience === 'issuer' && r.issuer === undefined) {
      issue(
        ['assertion', 'audience'],
        '"issuer" needs tokenRequest.issuer, the issuer identifier the assertion is addressed to',
      );
    }
    if (presentsCertificate(r.auth) && r.url !== undefined && !r.url.startsWith('https:')) {
      issue(
        ['url'],
        `must be https:// with auth "${r.auth}": the client certificate is presented in the TLS handshake`,
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

/** Signature algorithms for DPoP proofs (RFC 9449 §4.2), as jose signs them. */
export const DPOP_ALGS = ['ES256', 'PS256', 'RS256', 'EdDSA'] as const;
export type DpopAlg = (typeof DPOP_ALGS)[number];

/** Where a client's DPoP proof key comes from: exactly one. */
const dpopKeySchema = z
  .object({
    secretId: secretIdSchema.optional().meta({
      description:
        'AWS Secrets Manager secret holding the private key (a private JWK, or PEM PKCS#8, ' +
        'PKCS#1 or SEC1), the same for every replica.',
      env: 'DPOP_KEY_SECRET_ID',
    }),
    file: filePathSchema.optional().meta({
      description: 'A file holding the private key (JWK or PEM), e.g. a mounted Secret.',
      env: 'DPOP_KEY_FILE',
    }),
    generate: flag.optional().meta({
      description:
        'Generate the key once for the whole fleet: the first replica to start stores it ' +
        'sealed with the cache encryption key in Redis (first writer wins), every other ' +
        'replica and every restart reads that one. Needs a cache encryption key with Redis.',
      env: 'DPOP_KEY_GENERATE',
    }),
  })
  .strict()
  .superRefine((k, ctx) => {
    const issue = issuesOf(ctx);
    if (k.generate === false) issue(['generate'], 'set it to true, or leave it out');
    const sources = [k.secretId, k.file, k.generate === true ? true : undefined];
    if (sources.filter((v) => v !== undefined).length !== 1) {
      issue([], 'set exactly one of secretId, file or generate');
    }
  });
export type DpopKeySource = z.infer<typeof dpopKeySchema>;

/**
 * DPoP (RFC 9449): the broker holds the proof key for the fleet, sends a proof with every token
 * request and every forwarded call, and never hands the bare token out.
 */
const dpopSchema = z
  .object({
    key: dpopKeySchema.default({ generate: true }).meta({
      description: 'The proof key, one per client, shared by every replica.',
      defaultText: 'generate',
    }),
    alg: z
      .enum(DPOP_ALGS)
      .default('ES256')
      .meta({
        description:
          'Proof signature algorithm; must fit the key (ES256: P-256, PS256/RS256: RSA, ' +
          "EdDSA: Ed25519) and be in the server's `dpop_signing_alg_values_supported`.",
        env: 'DPOP_ALG',
      }),
    handOut: flag.default(false).meta({
      description:
        'Let `GET /token` and `POST /oauth2/token` hand a caller the token with one ' +
        'one-time proof for the method and URL it names (`dpop_htm`, `dpop_htu`). ' +
        'Otherwise they answer 403 `dpop_bound_token`: use the passthrough.',
      env: 'DPOP_HAND_OUT',
    }),
  })
  .strict();
export type DpopSettings = z.infer<typeof dpopSchema>;

/** One set of provider credentials: one merchant in one environment (e.g. `acme-preprod`). */
export const clientSchema = z
  .object({
    id: z
      .string()
      .regex(CLIENT_ID_PATTERN, {
        message: 'must be 1-63 lowercase letters, digits, ".", "_" or "-"',
      })
      .meta({
        description: 'Client id used in `?client=`, cache keys, locks and metric labels.',
        env: 'CLIENT_ID',
      }),
    authUrl: httpUrl.optional().meta({
      description:
        "The provider's `{auth_url}`; the token is requested at " +
        '`{authUrl}/api/auth/v1/oauth/token`. Required with grant `provider-query`, unused ' +
        'with `rfc6749` (which has `tokenRequest.url` or `issuer`).',
      env: 'PROVIDER_AUTH_URL',
    }),
    baseUrl: httpUrl.meta({
      description: "The provider's `{base_url}` for the checkout API.",
      env: 'PROVIDER_BASE_URL',
    }),
    ordersPath: path.default('/api/checkout/v1/orders').meta({
      defaultText:
        "'/api/checkout/v1/orders' (the documented path; the plugin uses `/api/flexpay/v1/orders`)",
      env: 'PROVIDER_ORDERS_PATH',
    }),
    caFile: filePathSchema.optional().meta({
      description:
        "PEM file of CA certificates trusted, besides Node's own roots and " +
        "`NODE_EXTRA_CA_CERTS`, for this client's connections only: its token endpoint, its " +
        'metadata (`tokenRequest.issuer`) and `baseUrl`. Re-read every ' +
        '`CREDENTIALS_RELOAD_SECONDS`.',
      env: 'PROVIDER_CA_FILE',
    }),
    credentials: clientCredentialsSourceSchema.meta({
      description:
        'The client\'s credentials JSON: `{"client_id","client_secret"}`, ' +
        '`{"client_id","private_key"}` (private_key_jwt; PEM or JWK) or ' +
        '`{"client_id","certificate","private_key"}` (the mutual-TLS methods; PEM). When the ' +
        'server refuses them, a Secrets Manager secret is re-read at AWSCURRENT, then ' +
        'AWSPENDING, then AWSPREVIOUS, and the first version it accepts is used, and kept at ' +
        'each re-read until AWSCURRENT changes; a file is re-read. Key-based methods may ' +
        'instead name PEM files (`clientId`, `privateKeyFile` and, for the mutual-TLS methods, ' +
        '`certificateFile`), re-read likewise.',
      envFields: { secretId: 'CREDENTIALS_SECRET_ID', file: 'CREDENTIALS_FILE' },
    }),
    tokenRequest: tokenRequestSchema
      .default(() => tokenRequestSchema.parse({}))
      .meta({
        description: "The token request's shape and client authentication.",
        defaultText: "the provider's dialect",
      }),
    tokenRejection: tokenRejectionSchema
      .default(() => tokenRejectionSchema.parse({}))
      .meta({
        description: 'Which provider 401s mean the token was refused.',
        defaultText: 'see its fields',
      }),
    dpop: dpopSchema.optional().meta({
      description:
        'DPoP (RFC 9449) sender-constrained tokens: proofs on token requests and on every ' +
        'forwarded call. Grant `rfc6749` only.',
      defaultText: 'off (bearer tokens)',
    }),
    forward: clientForwardSchema.default({}).meta({
      description: "The provider passthrough's allow-list for this client.",
      defaultText: 'create order, marketing reads',
    }),
  })
  .strict()
  .superRefine((c, ctx) => {
    // Key files carry no shared secret: they fit the key-based methods only, and mTLS needs both.
    const { auth } = c.tokenRequest;
    if (c.dpop !== undefined && c.tokenRequest.grant !== 'rfc6749') {
      ctx.addIssue({
        code: 'custom',
        path: ['dpop'],
        message:
          'only with tokenRequest.grant "rfc6749": the provider\'s dialect ("provider-query") knows no DPoP',
      });
    }
    if (c.tokenRequest.grant === 'provider-query' && c.authUrl === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['authUrl'],
        message: 'required with grant "provider-query": the token is requested below it',
      });
    }
    const issue = (field: string, message: string) =>
      ctx.addIssue({ code: 'custom', path: ['credentials', field], message });
    if (c.credentials.privateKeyFile === undefined) return;
    if (auth !== 'private_key_jwt' && !presentsCertificate(auth)) {
      issue(
        'privateKeyFile',
        `only with auth "private_key_jwt", "tls_client_auth" or "self_signed_tls_client_auth"; auth "${auth}" needs a client_secret from secretId or file`,
      );
    } else if (presentsCertificate(auth) && c.credentials.certificateFile === undefined) {
      issue('certificateFile', `required with auth "${auth}" and privateKeyFile`);
    } else if (auth === 'private_key_jwt' && c.credentials.certificateFile !== undefined) {
      issue(
        'certificateFile',
        'only with the mutual-TLS methods; private_key_jwt signs with the key alone',
      );
    }
  })
  // The default opens the client's own orders path, so it is filled in once that is known.
  .transform((c) => ({
    ...c,
    forward: { ...c.forward, allow: c.forward.allow ?? defaultForwardRules(c.ordersPath) },
  }));
export type ClientConfig = z.infer<typeof clientSchema>;
