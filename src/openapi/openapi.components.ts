import { CLIENT_AUTH_METHODS, TOKEN_GRANTS } from '../config/client.schema';
import { REDIS_MODES } from '../config/redis.schema';
import { z } from 'zod';

// Objects are loose: a field added to an answer is not a breaking change.

export type Json = Record<string, unknown>;
const dateTime = z.string().meta({ format: 'date-time' });
const fingerprint = z.string().regex(/^[0-9a-f]{16}$/);
const count = z.int().min(0);
const names = z.array(z.string());
const report = z.looseObject({}).optional();

const SCHEMAS = {
  TokenResponse: z.looseObject({
    access_token: z.string().min(1),
    token_type: z
      .enum(['Bearer', 'DPoP'])
      .describe(
        '`DPoP` only for a DPoP client with `dpop.handOut`, asked with `dpop_htm`/`dpop_htu`.',
      ),
    expires_in: count.describe('Remaining lifetime, seconds.'),
    expires_at: dateTime.optional(),
    dpop_proof: z
      .string()
      .describe(
        'DPoP hand-out: a one-time proof (RFC 9449) for `dpop_htm` on `dpop_htu`; send it as the `DPoP` header.',
      )
      .optional(),
    dpop_htm: z.string().describe('DPoP hand-out: the method the proof is for.').optional(),
    dpop_htu: z.string().describe('DPoP hand-out: the URL the proof is for (no query).').optional(),
  }),
  Problem: z
    .looseObject({
      type: z.string().regex(/^urn:token-broker:problem:/),
      title: z.string(),
      status: z.int().min(400).max(599),
      detail: z.string(),
      code: z.string(),
      requestId: z.string().optional(),
    })
    .describe('RFC 9457 problem details with a stable `code`.'),
  OAuthTokenRequest: z.looseObject({
    grant_type: z.literal('client_credentials'),
    resource: z.string().describe('RFC 8707: the provider client id.').optional(),
    audience: z.string().optional(),
    scope: z.string().describe('One provider client id.').optional(),
    client_id: z.string().optional(),
    client_secret: z.string().optional(),
    client_assertion_type: z
      .literal('urn:ietf:params:oauth:client-assertion-type:jwt-bearer')
      .optional(),
    client_assertion: z.string().optional(),
    dpop_htm: z
      .string()
      .describe('DPoP clients with `dpop.handOut`: the method of the call to sign a proof for.')
      .optional(),
    dpop_htu: z
      .string()
      .describe("DPoP clients with `dpop.handOut`: the URL (under the client's baseUrl).")
      .optional(),
  }),
  OAuthError: z.looseObject({ error: z.string(), error_description: z.string().optional() }),
  AuthorizationServerMetadata: z.looseObject({
    issuer: z.string(),
    token_endpoint: z.string(),
    grant_types_supported: z.array(z.literal('client_credentials')),
    response_types_supported: z.array(z.string()).max(0).optional(),
    token_endpoint_auth_methods_supported: z
      .array(z.enum(['client_secret_basic', 'client_secret_post', 'none']))
      .describe(
        'Empty in caller-auth mode `kubernetes`: the service-account token sent as `client_assertion` is a reusable bearer credential, which no registered method names (it is not `private_key_jwt`).',
      ),
  }),
  ProviderAnswer: z.unknown().describe("The provider's JSON, passed through unchanged."),
  AdminStatus: z.looseObject({
    replica: z
      .string()
      .describe(
        'The replica that answered, `<host>:<pid>` (the pod name in Kubernetes), as lock holders are named: every field below is its own view',
      ),
    store: z.looseObject({
      kind: z.enum(['redis', 'memory']),
      mode: z.enum(REDIS_MODES).optional(),
      nodes: names.optional(),
      state: z.enum(['up', 'down', 'misconfigured']),
    }),
    clients: z.array(
      z.looseObject({
        client: z.string(),
        tokenRequest: z
          .looseObject({
            grant: z.enum(TOKEN_GRANTS),
            auth: z.enum(CLIENT_AUTH_METHODS),
          })
          .describe(
            "How the client asks for its token: the provider's dialect (`provider-query`) or a standard RFC 6749 request, and its client authentication (`clients[].tokenRequest`)",
          ),
        fingerprint: fingerprint.optional(),
        expiresAt: dateTime.optional(),
        obtainedAt: dateTime.optional(),
        generation: count,
        lastRefresh: z
          .looseObject({
            at: dateTime.optional(),
            outcome: z.enum(['fetched', 'adopted', 'failed']).optional(),
            forced: z.literal(true).optional(),
          })
          .describe(
            "This replica's own last refresh: `fetched` by its own provider request, `adopted` from the store (another replica's), or `failed`; `forced` when it was an operator's forced refresh made on this replica",
          )
          .optional(),
        lastError: z.string().optional(),
        refreshing: z.boolean(),
        lock: z.looseObject({
          held: z.boolean().optional(),
          holder: z.string().optional(),
          ttlMs: z.int().optional(),
          error: z.string().optional(),
        }),
      }),
    ),
  }),
  AdminRefresh: z.looseObject({
    client: z.string(),
    fingerprint,
    expiresAt: dateTime.optional(),
    providerRequest: z.boolean(),
    written: z.boolean(),
  }),
  AdminRevoke: z.looseObject({
    client: z.string(),
    generation: z.int().min(1),
    revokedFingerprint: fingerprint.optional(),
    replicas: z.looseObject({ notified: count, acknowledged: count }),
    replacement: z
      .looseObject({ fingerprint, expiresAt: z.string(), reissued: z.boolean() })
      .nullable()
      .describe(
        "This replica's next token, once held within 3 s (else null); `reissued`: the provider granted the revoked token again.",
      ),
    warning: z
      .string()
      .optional()
      .describe('Set when the provider re-issued the revoked token: revoke it at the provider.'),
  }),
  AdminReload: z.looseObject({
    replicas: z
      .looseObject({ notified: count.optional(), error: z.string().optional() })
      .describe(
        'How many replicas the reload request reached through Redis (this one included), or why none could be asked.',
      ),
    credentials: z.looseObject({
      changed: names.optional(),
      firstRead: names
        .describe(
          "Read for the first time on this replica (it had only adopted the fleet's tokens): nothing to compare with.",
        )
        .optional(),
      failed: names.optional(),
    }),
    callers: z.looseObject({
      added: names.optional(),
      removed: names.optional(),
      error: z.string().optional(),
    }),
    clients: z
      .looseObject({
        added: names.optional(),
        removed: names.optional(),
        changed: names.optional(),
        error: z.string().optional(),
      })
      .describe(
        'The client list re-read from the configuration on this replica: clients started, stopped and replaced; `error`: the configuration was refused as a whole (why), the running clients stay.',
      ),
  }),
  HealthReport: z.looseObject({
    status: z.enum(['ok', 'error', 'shutting_down']),
    info: report,
    error: report,
    details: report,
  }),
};

export type SchemaName = keyof typeof SCHEMAS;
export const ref = (name: SchemaName) => ({ $ref: `#/components/schemas/${name}` });
export const header = (name: string) => ({ $ref: `#/components/headers/${name}` });
export const REQUEST_ID = { 'X-Request-Id': header('X-Request-Id') };
export const NO_STORE = { ...REQUEST_ID, 'Cache-Control': header('Cache-Control-No-Store') };
export const REPLAYED = { 'Idempotent-Replayed': header('Idempotent-Replayed') };
export const RETRY_AFTER = { 'Retry-After': header('Retry-After') };

export function ok(
  description: string,
  schema: Json,
  headers: Json = NO_STORE,
  example?: Json,
): Json {
  return { description, headers, content: { 'application/json': { schema, example } } };
}

export const BEARER = [{ bearer: [] }];

/** A configured client id, in a path or the query. */
export const clientParam = (name: string, where: 'path' | 'query', description: string) => ({
  name,
  in: where,
  ...(where === 'path' && { required: true }),
  description,
  schema: { type: 'string', minLength: 1 },
  example: 'acme-prod',
});

const headerOf = (description: string, schema: Json, required = true) => ({
  description,
  ...(required && { required }),
  schema,
});

const matching = (pattern: string) => ({ type: 'string', pattern });

const SECURITY_SCHEMES = {
  bearer: {
    type: 'http',
    scheme: 'bearer',
    description:
      "Mode `api-key`: the caller's API key. Mode `kubernetes`: the projected service-account token (audience `token-broker`).",
  },
  basic: {
    type: 'http',
    scheme: 'basic',
    description: 'client_secret_basic: caller name and API key (or send them as form fields).',
  },
};

const HEADERS = {
  'X-Request-Id': headerOf(
    "The caller's own X-Request-Id when it sent a valid one (`[A-Za-z0-9._:-]{1,128}`), else the broker's id of the request. A problem's `requestId` is always the broker's id, logged as `reqId` (the caller's as `callerRequestId`): quote that.",
    { type: 'string' },
  ),
  'Cache-Control-No-Store': headerOf('Never cache: tokens and errors are of the moment.', {
    const: 'no-store',
  }),
  'Cache-Control-Max-Age': headerOf('May be cached briefly.', matching('^max-age=\\d+$')),
  Pragma: headerOf('RFC 6749 §5.1.', { const: 'no-cache' }),
  'Retry-After': headerOf('Seconds to wait before trying again.', matching('^\\d+$')),
  'WWW-Authenticate-Bearer': headerOf('The scheme to authenticate with.', {
    const: 'Bearer realm="token-broker"',
  }),
  'WWW-Authenticate-Basic': headerOf(
    'HTTP Basic, as RFC 6749 §5.2 requires after a failed Basic authentication.',
    matching('^Basic realm="token-broker"'),
  ),
  'Idempotent-Replayed': headerOf(
    '`true` when this is the stored answer of an earlier request with the same key.',
    { const: 'true' },
    false,
  ),
};

/** Built when the document is asked for (its JSON Schemas are generated then), not at start-up. */
export function components(): Json {
  return {
    securitySchemes: SECURITY_SCHEMES,
    headers: HEADERS,
    schemas: Object.fromEntries(
      Object.entries(SCHEMAS).map(([name, schema]) => {
        const json = z.toJSONSchema(schema);
        delete json.$schema; // the document's dialect already
        return [name, json];
      }),
    ),
  };
}
