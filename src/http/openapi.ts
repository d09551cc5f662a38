/**
 * The broker's OpenAPI 3.1 description, served at `GET /openapi.json`. It is checked in, not
 * generated: `test/openapi.e2e-spec.ts` validates real answers of running brokers against it
 * (status, media type, body schema, headers, problem `code`), checks that every route Fastify
 * registers is described and every described route exists, and that every problem code of the
 * `*.exception.ts` enums appears. Change a route and that test says what to change here.
 * Nothing in it depends on configuration: it holds no host, client id or secret.
 */

type Json = Record<string, unknown>;

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const header = (name: string) => ({ $ref: `#/components/headers/${name}` });

/** The headers every answer carries. */
const COMMON_HEADERS = { 'X-Request-Id': header('X-Request-Id') };

/** A problem+json answer whose `code` is one of `codes`. */
function problem(description: string, codes: string[], extraHeaders: Json = {}): Json {
  const [first] = codes;
  return {
    description: `${description}. \`code\`: ${codes.map((c) => `\`${c}\``).join(', ')}.`,
    headers: {
      ...COMMON_HEADERS,
      'Cache-Control': header('Cache-Control-No-Store'),
      ...extraHeaders,
    },
    content: {
      'application/problem+json': {
        schema: {
          allOf: [ref('Problem')],
          properties: { code: { enum: codes } },
        },
        example: {
          type: `urn:token-broker:problem:${first}`,
          title: 'See the code',
          status: 0,
          detail: 'a sentence saying what is wrong and what to do',
          code: first,
          requestId: '9f1c2a7e-4d1b-4f0e-9a55-0c6b8d2e1f3a',
        },
      },
    },
  };
}

/** An RFC 6749 §5.2 error answer of `POST /oauth2/token`. */
function oauthError(description: string, errors: string[], extraHeaders: Json = {}): Json {
  return {
    description: `${description}. \`error\`: ${errors.map((c) => `\`${c}\``).join(', ')}.`,
    headers: {
      ...COMMON_HEADERS,
      'Cache-Control': header('Cache-Control-No-Store'),
      Pragma: header('Pragma'),
      ...extraHeaders,
    },
    content: {
      'application/json': {
        schema: { allOf: [ref('OAuthError')], properties: { error: { enum: errors } } },
        example: { error: errors[0], error_description: 'what is wrong' },
      },
    },
  };
}

/**
 * An order refusal of the broker's, at a status the provider may also answer with: the
 * provider's own answer is passed through as `application/json`, the broker's is problem+json.
 */
function orRelayed(response: Json): Json {
  return {
    ...response,
    content: {
      ...(response.content as Json),
      'application/json': { schema: ref('ProviderAnswer') },
    },
  };
}

const retryAfter = { 'Retry-After': header('Retry-After') };

/** Answers any route can give before its handler runs. */
const GENERIC = {
  '404': problem('No such route', ['not_found']),
  '405': problem('Method not allowed on this path', ['method_not_allowed']),
  '408': problem(
    'The request line and headers, or the whole request, did not arrive in time (HTTP_HEADERS_TIMEOUT_MS, HTTP_REQUEST_TIMEOUT_MS)',
    ['request_timeout'],
  ),
  '413': problem('A request body over the server limit', ['payload_too_large']),
  '415': problem('A request body of a media type the server does not parse', [
    'unsupported_media_type',
  ]),
  '500': problem('Unexpected failure; quote the request id', ['internal_error']),
};

const CALLER_AUTH = {
  '401': problem('Missing or bad caller credential', ['unauthenticated'], {
    'WWW-Authenticate': header('WWW-Authenticate-Bearer'),
  }),
  '403': problem('The caller may not use this client', ['forbidden']),
};

/** An admin route's 200: JSON of component `schema`, never cached. */
function adminAnswer(description: string, schema: string): Json {
  return {
    description,
    headers: { ...COMMON_HEADERS, 'Cache-Control': header('Cache-Control-No-Store') },
    content: { 'application/json': { schema: ref(schema) } },
  };
}

/** The admin routes: a caller credential with scope `admin`. */
const ADMIN_AUTH = {
  '401': CALLER_AUTH['401'],
  '403': problem('The caller lacks scope `admin`, or may not use this client', ['forbidden']),
};

const ADMIN_CLIENT_PARAM = {
  name: 'id',
  in: 'path',
  required: true,
  description: "The provider client (a configured client id in the caller's grant).",
  schema: { type: 'string', minLength: 1 },
  example: 'acme-prod',
};

const CLIENT_PARAM = {
  name: 'client',
  in: 'query',
  description:
    'The provider client (a configured client id). Optional when the caller may use exactly one client, or only one is configured.',
  schema: { type: 'string', minLength: 1 },
  example: 'acme-prod',
};

/** Refusals `POST /orders` and the passthrough share (the forwarding core's). */
const FORWARDING_500 = problem(
  'Unexpected failure, or a stored idempotency record failed its integrity check (never replayed); quote the request id',
  ['internal_error', 'idempotency_record_tampered'],
);
const FORWARDING_503 = problem(
  'No token, the idempotency store is unreachable, or the broker is shutting down',
  [
    'token_unavailable',
    'idempotency_unavailable',
    'credentials_rejected',
    'credentials_unavailable',
    'shutting_down',
    'caller_auth_unavailable',
  ],
  retryAfter,
);

// --- Provider passthrough (issue #15) ---
/** The passthrough in the document; Fastify registers it as `/provider/*`. */
const FORWARD_PATH = '/provider/{client}/{providerPath}';
const FORWARD_ROUTE = '/provider/*';

/** One method of `/provider/{client}/{providerPath}` (HEAD is described by GET). */
function forwardOperation(method: string): Json {
  const withBody = method !== 'get' && method !== 'delete';
  return {
    tags: ['passthrough'],
    operationId: `forward${method[0].toUpperCase()}${method.slice(1)}`,
    summary: `Forward a ${method.toUpperCase()} to the provider with the fleet's token`,
    description:
      "Sent to `{base_url}/{providerPath}?{query}` with the provider's headers and the client's bearer token; the provider's status, safe headers and body come back (streamed). Allowed only where the client's allow-list (`clients[].forward.allow`) lets the method and path pass; `..`, encoded slashes, `//` and the like are refused, never normalised. Requires scope `forward`. On POST, PUT, PATCH and DELETE an `Idempotency-Key` replays the stored answer to a repeat (keys are scoped by method and path). Rate limited per client and per caller (429 `forward_rate_limited`). A provider 429 is passed back with its `Retry-After`.",
    security: [{ bearer: [] }],
    parameters: [
      {
        name: 'client',
        in: 'path',
        required: true,
        description: 'The provider client (a configured client id).',
        schema: { type: 'string', minLength: 1 },
        example: 'acme-prod',
      },
      {
        name: 'providerPath',
        in: 'path',
        required: true,
        description:
          'The provider path below `{base_url}`, slashes included (e.g. `api/marketing/v1/offers`); the query string is passed on as is.',
        schema: { type: 'string', minLength: 1 },
        example: 'api/marketing/v1/offers',
      },
      {
        name: 'Idempotency-Key',
        in: 'header',
        description:
          'POST, PUT, PATCH, DELETE: 1-255 printable ASCII characters; a new UUID per request.',
        schema: { type: 'string', minLength: 1, maxLength: 255 },
      },
    ],
    ...(withBody && {
      requestBody: {
        required: false,
        description:
          'Any media type, passed through byte for byte (up to FORWARD_BODY_LIMIT_BYTES).',
        content: { '*/*': { schema: {} } },
      },
    }),
    responses: {
      default: {
        description:
          "The provider's answer, passed through: status, body and the safe headers (content type and length, cache headers, `Retry-After`, `Location`, the provider's request id as `X-Provider-Request-Id`; never `Set-Cookie`). The broker's own refusals are problem+json with the codes below.",
        headers: { ...COMMON_HEADERS, 'Idempotent-Replayed': header('Idempotent-Replayed') },
        content: { '*/*': { schema: {} } },
      },
      '400': orRelayed(
        problem('Malformed provider path or query, or a bad Idempotency-Key', [
          'forward_path_invalid',
          'idempotency_key_invalid',
          'invalid_request',
        ]),
      ),
      '401': orRelayed(CALLER_AUTH['401']),
      '403': orRelayed(
        problem(
          'The caller may not use this client or forward (scope), or the allow-list does not cover the method and path',
          ['forbidden', 'forward_not_allowed'],
        ),
      ),
      '404': orRelayed(
        problem('Unknown client, or no such route', ['unknown_client', 'not_found']),
      ),
      '409': orRelayed(
        problem(
          'The first request with this key is in flight, or its outcome is unknown',
          ['forward_in_flight', 'forward_outcome_unknown'],
          retryAfter,
        ),
      ),
      '413': orRelayed(problem('Body over FORWARD_BODY_LIMIT_BYTES', ['forward_body_too_large'])),
      '422': orRelayed(
        problem('Same Idempotency-Key, different query or body', ['idempotency_key_reused']),
      ),
      '429': orRelayed(
        problem(
          "Over the client's or the caller's rate limit at the broker, or the caller holds the most Idempotency-Key records it may (nothing sent)",
          ['forward_rate_limited', 'idempotency_records_exceeded'],
          retryAfter,
        ),
      ),
      '408': GENERIC['408'],
      '500': FORWARDING_500,
      '502': orRelayed(
        problem(
          'The provider refused the token, could not be reached, answered badly, or its answer contained the access token (withheld)',
          [
            'forward_token_rejected',
            'forward_provider_unreachable',
            'forward_provider_bad_response',
            'forward_upstream_echoed_token',
          ],
        ),
      ),
      '503': orRelayed(FORWARDING_503),
      '504': orRelayed(
        problem('Sent, no answer in time: check with the provider', ['forward_provider_timeout']),
      ),
    },
  };
}
// --- end provider passthrough ---

export const OPENAPI_DOCUMENT: Json = {
  openapi: '3.1.0',
  info: {
    title: 'Token broker',
    version: '0.1.0',
    description:
      "One provider OAuth token per fleet, served from memory. Callers get the fleet's token (`GET /token`, or `POST /oauth2/token` for stock OAuth 2.0 clients) and forward orders (`POST /orders`). Errors are RFC 9457 problem+json with a stable `code` (the OAuth endpoint answers RFC 6749 errors instead).",
  },
  servers: [{ url: '/', description: 'The broker, as the caller reaches it' }],
  tags: [
    { name: 'tokens' },
    { name: 'orders' },
    { name: 'passthrough' },
    { name: 'operations', description: 'No caller authentication' },
    {
      name: 'admin',
      description:
        'Operators: scope `admin`; on the admin port (`ADMIN_PORT`) when set, with `/metrics` and `/health/*`',
    },
  ],
  paths: {
    '/token': {
      get: {
        tags: ['tokens'],
        operationId: 'getToken',
        summary: "The fleet's provider token, from memory",
        security: [{ bearer: [] }],
        parameters: [
          CLIENT_PARAM,
          {
            name: 'min_ttl',
            in: 'query',
            description:
              'Seconds the token must stay valid at least, up to `TOKEN_REFRESH_AHEAD_SECONDS` (tokens are replaced that long before they expire); more is a 400.',
            schema: { type: 'integer', minimum: 0 },
            example: 60,
          },
        ],
        responses: {
          '200': {
            description: 'The token. `expires_in` is the remaining lifetime.',
            headers: { ...COMMON_HEADERS, 'Cache-Control': header('Cache-Control-No-Store') },
            content: {
              'application/json': {
                schema: ref('TokenResponse'),
                example: {
                  access_token: 'eyJhbGciOi…',
                  token_type: 'Bearer',
                  expires_in: 1612,
                  expires_at: '2026-11-22T10:30:00.000Z',
                },
              },
            },
          },
          '400': problem('Bad query, or the client must be named', [
            'invalid_request',
            'client_required',
          ]),
          ...CALLER_AUTH,
          '404': problem('Unknown client, or no such route', ['unknown_client', 'not_found']),
          '405': GENERIC['405'],
          '500': GENERIC['500'],
          '503': problem(
            'No valid token can be had now, or the caller cannot be verified now',
            [
              'token_unavailable',
              'credentials_rejected',
              'credentials_unavailable',
              'shutting_down',
              'caller_auth_unavailable',
            ],
            retryAfter,
          ),
        },
      },
    },
    '/oauth2/token': {
      post: {
        tags: ['tokens'],
        operationId: 'oauthToken',
        summary: 'RFC 6749 token endpoint (client credentials) for stock OAuth clients',
        description:
          'Caller authentication: `client_secret_basic` or `client_secret_post` (client id = caller name, secret = API key) in mode `api-key`; an RFC 7523 client assertion (the projected service-account token) in mode `kubernetes`. The provider client: `resource`, else `audience`, else `scope`; implied when the caller may use one client.',
        security: [{ basic: [] }, {}],
        requestBody: {
          required: true,
          content: {
            'application/x-www-form-urlencoded': {
              schema: ref('OAuthTokenRequest'),
              example: { grant_type: 'client_credentials', resource: 'acme-prod' },
            },
          },
        },
        responses: {
          '200': {
            description: 'RFC 6749 §5.1 answer.',
            headers: {
              ...COMMON_HEADERS,
              'Cache-Control': header('Cache-Control-No-Store'),
              Pragma: header('Pragma'),
            },
            content: {
              'application/json': {
                schema: ref('TokenResponse'),
                example: {
                  access_token: 'eyJhbGciOi…',
                  token_type: 'Bearer',
                  expires_in: 1612,
                  expires_at: '2026-11-22T10:30:00.000Z',
                },
              },
            },
          },
          '400': oauthError('RFC 6749 §5.2 error', [
            'invalid_request',
            'invalid_client',
            'unauthorized_client',
            'unsupported_grant_type',
            'invalid_scope',
            'invalid_target',
          ]),
          '401': oauthError(
            'Bad client credentials sent with HTTP Basic, or none',
            ['invalid_client'],
            {
              'WWW-Authenticate': header('WWW-Authenticate-Basic'),
            },
          ),
          '500': oauthError('Unexpected failure', ['server_error']),
          '503': oauthError(
            'No valid token can be had now',
            ['temporarily_unavailable'],
            retryAfter,
          ),
        },
      },
    },
    '/.well-known/oauth-authorization-server': {
      get: {
        tags: ['tokens'],
        operationId: 'oauthMetadata',
        summary:
          'RFC 8414 authorization server metadata (endpoint URLs from OAUTH_ISSUER, else the origin used)',
        responses: {
          '200': {
            description: 'The metadata.',
            headers: { ...COMMON_HEADERS, 'Cache-Control': header('Cache-Control-No-Store') },
            content: {
              'application/json': {
                schema: ref('AuthorizationServerMetadata'),
                example: {
                  issuer: 'http://token-broker',
                  token_endpoint: 'http://token-broker/oauth2/token',
                  grant_types_supported: ['client_credentials'],
                  response_types_supported: [],
                  token_endpoint_auth_methods_supported: [
                    'client_secret_basic',
                    'client_secret_post',
                  ],
                },
              },
            },
          },
          ...GENERIC,
        },
      },
    },
    '/orders': {
      post: {
        tags: ['orders'],
        operationId: 'createOrder',
        summary: "Forward an order to the provider with the fleet's token",
        description:
          "The JSON body reaches the provider byte for byte; the provider's status and body come back. With an `Idempotency-Key`, a repeat with the same key and body replays the stored answer instead of creating a second order.",
        security: [{ bearer: [] }],
        parameters: [
          CLIENT_PARAM,
          {
            name: 'Idempotency-Key',
            in: 'header',
            description: '1-255 printable ASCII characters; a new UUID per order.',
            schema: {
              type: 'string',
              minLength: 1,
              maxLength: 255,
              pattern: '^[\\x21-\\x7e](?:[\\x20-\\x7e]{0,253}[\\x21-\\x7e])?$',
            },
            example: '5b0f6f8e-5f0a-4a53-9f4e-2c7f4a1d9b10',
          },
        ],
        requestBody: {
          required: true,
          content: {
            'application/json': {
              schema: {
                type: 'object',
                description: "The provider's order (SPEC.md §2), passed through.",
              },
              example: { amount: 1999, currency: 'EUR', reference: 'cart-1234' },
            },
          },
        },
        responses: {
          '2XX': {
            description: "The provider's answer, passed through (201 when it created the order).",
            headers: {
              ...COMMON_HEADERS,
              'Cache-Control': header('Cache-Control-No-Store'),
              'Idempotent-Replayed': header('Idempotent-Replayed'),
            },
            content: {
              'application/json': {
                schema: ref('ProviderAnswer'),
                example: { id: 'ord_7Hq2', status: 'created' },
              },
            },
          },
          '4XX': {
            description:
              "The provider's own refusal, passed through (not problem+json; the broker's refusals below are).",
            headers: { ...COMMON_HEADERS, 'Idempotent-Replayed': header('Idempotent-Replayed') },
            content: { 'application/json': { schema: ref('ProviderAnswer') } },
          },
          '400': orRelayed(
            problem('Bad body, key, or client', [
              'order_body_invalid',
              'idempotency_key_invalid',
              'client_required',
              'invalid_request',
            ]),
          ),
          ...CALLER_AUTH,
          '404': orRelayed(
            problem('Unknown client, or no such route', ['unknown_client', 'not_found']),
          ),
          '405': GENERIC['405'],
          '409': orRelayed(
            problem(
              'The first request with this key is in flight, or its outcome is unknown',
              ['order_in_flight', 'order_outcome_unknown'],
              retryAfter,
            ),
          ),
          '413': orRelayed(problem('Body over the configured limit', ['order_body_too_large'])),
          '415': orRelayed(problem('Not application/json', ['order_unsupported_media_type'])),
          '422': orRelayed(
            problem('Same Idempotency-Key, different body', ['idempotency_key_reused']),
          ),
          '408': GENERIC['408'],
          '500': FORWARDING_500,
          '502': problem(
            'The provider refused the token, could not be reached, answered badly, or its answer contained the access token (withheld)',
            [
              'order_token_rejected',
              'order_provider_unreachable',
              'order_provider_bad_response',
              'order_upstream_echoed_token',
            ],
          ),
          '503': FORWARDING_503,
          '504': problem('Sent, no answer in time: check with the provider', [
            'order_provider_timeout',
          ]),
        },
      },
    },
    // --- Provider passthrough (issue #15) ---
    [FORWARD_PATH]: Object.fromEntries(
      (['get', 'post', 'put', 'patch', 'delete'] as const).map((method) => [
        method,
        forwardOperation(method),
      ]),
    ),
    // --- end provider passthrough ---
    '/health/live': {
      get: {
        tags: ['operations'],
        operationId: 'live',
        summary: 'Liveness: the process answers',
        responses: {
          '200': {
            description: 'Alive.',
            headers: COMMON_HEADERS,
            content: {
              'application/json': {
                schema: {
                  type: 'object',
                  required: ['status'],
                  properties: { status: { const: 'ok' } },
                },
                example: { status: 'ok' },
              },
            },
          },
          ...GENERIC,
        },
      },
    },
    '/health/ready': {
      get: {
        tags: ['operations'],
        operationId: 'ready',
        summary: 'Readiness: credentials load and a token was obtained since start-up',
        responses: {
          '200': {
            description:
              'Ready (Redis down shows as `degraded`, still ready). The report (`info`, `details`) is answered on the admin port only; elsewhere `{"status":"ok"}`.',
            headers: COMMON_HEADERS,
            content: { 'application/json': { schema: ref('HealthReport') } },
          },
          '503': {
            description:
              'Not ready; on the admin port the report names the cause, elsewhere `{"status":"error"}`.',
            headers: { ...COMMON_HEADERS, 'Cache-Control': header('Cache-Control-No-Store') },
            content: { 'application/json': { schema: ref('HealthReport') } },
          },
          ...GENERIC,
        },
      },
    },
    '/metrics': {
      get: {
        tags: ['operations'],
        operationId: 'metrics',
        summary: "Prometheus metrics (keep off the callers' network)",
        responses: {
          '200': {
            description: 'Prometheus text format 0.0.4.',
            headers: { ...COMMON_HEADERS, 'Cache-Control': header('Cache-Control-No-Store') },
            content: { 'text/plain': { schema: { type: 'string' } } },
          },
          ...GENERIC,
        },
      },
    },
    // ---- Admin routes (issue #16): on the admin port when ADMIN_PORT is set ----------------
    '/admin/clients': {
      get: {
        tags: ['admin'],
        operationId: 'adminClients',
        summary: "Every client in the caller's grant, as this replica sees it, and the store",
        security: [{ bearer: [] }],
        responses: {
          '200': adminAnswer(
            "Per client: the token's fingerprint (16 hex of SHA-256, never the token), expiry, when and how this replica last got it (`fetched`, `adopted`, `failed`), the revocation generation, the refresh lock's holder, the last error; and the store's kind, mode, nodes and state.",
            'AdminStatus',
          ),
          ...ADMIN_AUTH,
          ...GENERIC,
        },
      },
    },
    '/admin/clients/{id}/refresh': {
      post: {
        tags: ['admin'],
        operationId: 'adminRefresh',
        summary:
          'A new token for the whole fleet: one provider request under the refresh lock, fenced, adopted by every replica',
        security: [{ bearer: [] }],
        parameters: [ADMIN_CLIENT_PARAM],
        responses: {
          '200': adminAnswer(
            '`providerRequest` is false when the refresh joined one asked for at the same time (on any replica).',
            'AdminRefresh',
          ),
          ...ADMIN_AUTH,
          '404': problem('Unknown client, or no such route', ['unknown_client', 'not_found']),
          '502': problem('The provider did not grant a token', ['admin_refresh_failed']),
          '503': problem(
            'Redis does not answer, or the lock stayed held; retry',
            ['admin_store_unavailable', 'token_unavailable'],
            { 'Retry-After': header('Retry-After') },
          ),
          '500': GENERIC['500'],
        },
      },
    },
    '/admin/clients/{id}/revoke': {
      post: {
        tags: ['admin'],
        operationId: 'adminRevoke',
        summary:
          "Drops the client's token on every replica for good (a new generation); a new one is fetched",
        security: [{ bearer: [] }],
        parameters: [ADMIN_CLIENT_PARAM],
        responses: {
          '200': adminAnswer(
            '`replicas.notified`: replicas the notification reached; `acknowledged`: those that dropped the token within 2 s.',
            'AdminRevoke',
          ),
          ...ADMIN_AUTH,
          '404': problem('Unknown client, or no such route', ['unknown_client', 'not_found']),
          '503': problem('Redis does not answer; retry', ['admin_store_unavailable'], {
            'Retry-After': header('Retry-After'),
          }),
          '500': GENERIC['500'],
        },
      },
    },
    '/admin/reload': {
      post: {
        tags: ['admin'],
        operationId: 'adminReload',
        summary:
          'Re-reads client credentials and caller grants now, on this replica and (through Redis) every other',
        security: [{ bearer: [] }],
        responses: {
          '200': adminAnswer(
            'Names only, for this replica: the clients whose credentials changed, the callers added or removed; `replicas`: how many replicas heard the request (each logs its own outcome).',
            'AdminReload',
          ),
          ...ADMIN_AUTH,
          ...GENERIC,
        },
      },
    },
    '/openapi.json': {
      get: {
        tags: ['operations'],
        operationId: 'openapi',
        summary: 'This document',
        responses: {
          '200': {
            description: 'OpenAPI 3.1.',
            headers: { ...COMMON_HEADERS, 'Cache-Control': header('Cache-Control-Max-Age') },
            content: {
              'application/json': { schema: { type: 'object', required: ['openapi', 'paths'] } },
            },
          },
          ...GENERIC,
        },
      },
    },
  },
  components: {
    securitySchemes: {
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
    },
    headers: {
      'X-Request-Id': {
        description:
          "The caller's own X-Request-Id when it sent a valid one (`[A-Za-z0-9._:-]{1,128}`), else the broker's id of the request. A problem's `requestId` is always the broker's id, logged as `reqId` (the caller's as `callerRequestId`): quote that.",
        required: true,
        schema: { type: 'string' },
      },
      'Cache-Control-No-Store': {
        description: 'Never cache: tokens and errors are of the moment.',
        required: true,
        schema: { const: 'no-store' },
      },
      'Cache-Control-Max-Age': {
        description: 'May be cached briefly.',
        required: true,
        schema: { type: 'string', pattern: '^max-age=\\d+$' },
      },
      Pragma: { description: 'RFC 6749 §5.1.', required: true, schema: { const: 'no-cache' } },
      'Retry-After': {
        description: 'Seconds to wait before trying again.',
        required: true,
        schema: { type: 'string', pattern: '^\\d+$' },
      },
      'WWW-Authenticate-Bearer': {
        description: 'The scheme to authenticate with.',
        required: true,
        schema: { const: 'Bearer realm="token-broker"' },
      },
      'WWW-Authenticate-Basic': {
        description: 'HTTP Basic, as RFC 6749 §5.2 requires after a failed Basic authentication.',
        required: true,
        schema: { type: 'string', pattern: '^Basic realm="token-broker"' },
      },
      'Idempotent-Replayed': {
        description:
          '`true` when this is the stored answer of an earlier request with the same key.',
        schema: { const: 'true' },
      },
    },
    schemas: {
      TokenResponse: {
        type: 'object',
        required: ['access_token', 'token_type', 'expires_in'],
        properties: {
          access_token: { type: 'string', minLength: 1 },
          token_type: { const: 'Bearer' },
          expires_in: { type: 'integer', minimum: 0, description: 'Remaining lifetime, seconds.' },
          expires_at: { type: 'string', format: 'date-time' },
        },
      },
      Problem: {
        type: 'object',
        description: 'RFC 9457 problem details with a stable `code`.',
        required: ['type', 'title', 'status', 'detail', 'code'],
        properties: {
          type: { type: 'string', pattern: '^urn:token-broker:problem:' },
          title: { type: 'string' },
          status: { type: 'integer', minimum: 400, maximum: 599 },
          detail: { type: 'string' },
          code: { type: 'string' },
          requestId: { type: 'string' },
        },
      },
      OAuthTokenRequest: {
        type: 'object',
        required: ['grant_type'],
        properties: {
          grant_type: { const: 'client_credentials' },
          resource: { type: 'string', description: 'RFC 8707: the provider client id.' },
          audience: { type: 'string' },
          scope: { type: 'string', description: 'One provider client id.' },
          client_id: { type: 'string' },
          client_secret: { type: 'string' },
          client_assertion_type: {
            const: 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer',
          },
          client_assertion: { type: 'string' },
        },
      },
      OAuthError: {
        type: 'object',
        required: ['error'],
        properties: { error: { type: 'string' }, error_description: { type: 'string' } },
      },
      AuthorizationServerMetadata: {
        type: 'object',
        required: [
          'issuer',
          'token_endpoint',
          'grant_types_supported',
          'token_endpoint_auth_methods_supported',
        ],
        properties: {
          issuer: { type: 'string' },
          token_endpoint: { type: 'string' },
          grant_types_supported: { type: 'array', items: { const: 'client_credentials' } },
          response_types_supported: { type: 'array', maxItems: 0 },
          token_endpoint_auth_methods_supported: {
            type: 'array',
            items: { enum: ['client_secret_basic', 'client_secret_post', 'private_key_jwt'] },
          },
          token_endpoint_auth_signing_alg_values_supported: {
            type: 'array',
            items: { type: 'string' },
          },
        },
      },
      ProviderAnswer: {
        description: "The provider's JSON, passed through unchanged.",
      },
      AdminStatus: {
        type: 'object',
        required: ['store', 'clients'],
        properties: {
          store: {
            type: 'object',
            required: ['kind', 'state'],
            properties: {
              kind: { enum: ['redis', 'memory'] },
              mode: { enum: ['standalone', 'sentinel', 'cluster'] },
              nodes: { type: 'array', items: { type: 'string' } },
              state: { enum: ['up', 'down', 'misconfigured'] },
            },
          },
          clients: {
            type: 'array',
            items: {
              type: 'object',
              required: ['client', 'generation', 'refreshing', 'lock'],
              properties: {
                client: { type: 'string' },
                fingerprint: { type: 'string', pattern: '^[0-9a-f]{16}$' },
                expiresAt: { type: 'string', format: 'date-time' },
                obtainedAt: { type: 'string', format: 'date-time' },
                generation: { type: 'integer', minimum: 0 },
                lastRefresh: {
                  type: 'object',
                  properties: {
                    at: { type: 'string', format: 'date-time' },
                    outcome: { enum: ['fetched', 'adopted', 'failed'] },
                  },
                },
                lastError: { type: 'string' },
                refreshing: { type: 'boolean' },
                lock: {
                  type: 'object',
                  properties: {
                    held: { type: 'boolean' },
                    holder: { type: 'string' },
                    ttlMs: { type: 'integer' },
                    error: { type: 'string' },
                  },
                },
              },
            },
          },
        },
      },
      AdminRefresh: {
        type: 'object',
        required: ['client', 'fingerprint', 'providerRequest', 'written'],
        properties: {
          client: { type: 'string' },
          fingerprint: { type: 'string', pattern: '^[0-9a-f]{16}$' },
          expiresAt: { type: 'string', format: 'date-time' },
          providerRequest: { type: 'boolean' },
          written: { type: 'boolean' },
        },
      },
      AdminRevoke: {
        type: 'object',
        required: ['client', 'generation', 'replicas'],
        properties: {
          client: { type: 'string' },
          generation: { type: 'integer', minimum: 1 },
          revokedFingerprint: { type: 'string', pattern: '^[0-9a-f]{16}$' },
          replicas: {
            type: 'object',
            required: ['notified', 'acknowledged'],
            properties: {
              notified: { type: 'integer', minimum: 0 },
              acknowledged: { type: 'integer', minimum: 0 },
            },
          },
        },
      },
      AdminReload: {
        type: 'object',
        required: ['credentials', 'callers', 'replicas'],
        properties: {
          replicas: {
            type: 'object',
            description:
              'How many replicas the reload request reached through Redis (this one included), or why none could be asked.',
            properties: {
              notified: { type: 'integer', minimum: 0 },
              error: { type: 'string' },
            },
          },
          credentials: {
            type: 'object',
            properties: {
              changed: { type: 'array', items: { type: 'string' } },
              firstRead: {
                type: 'array',
                items: { type: 'string' },
                description:
                  "Read for the first time on this replica (it had only adopted the fleet's tokens): nothing to compare with.",
              },
              failed: { type: 'array', items: { type: 'string' } },
            },
          },
          callers: {
            type: 'object',
            properties: {
              added: { type: 'array', items: { type: 'string' } },
              removed: { type: 'array', items: { type: 'string' } },
              error: { type: 'string' },
            },
          },
        },
      },
      HealthReport: {
        type: 'object',
        required: ['status'],
        properties: {
          status: { enum: ['ok', 'error', 'shutting_down'] },
          info: { type: 'object' },
          error: { type: 'object' },
          details: { type: 'object' },
        },
      },
    },
  },
};

/** `METHOD /path` of every operation in the document. */
export function describedRoutes(): string[] {
  const paths = OPENAPI_DOCUMENT.paths as Record<string, Record<string, unknown>>;
  // Fastify names path parameters `:id` where OpenAPI writes `{id}`.
  return Object.entries(paths).flatMap(([path, item]) =>
    Object.keys(item).map(
      (method) =>
        `${method.toUpperCase()} ${path === FORWARD_PATH ? FORWARD_ROUTE : path.replace(/\{(\w+)\}/g, ':$1')}`,
    ),
  );
}
