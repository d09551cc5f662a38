import { ForwardErrorCode, OrdersErrorCode } from '../forwarding/forwarding.exception';
import {
  BEARER,
  clientParam,
  components,
  header,
  type Json,
  NO_STORE,
  ok,
  ref,
  REPLAYED,
  REQUEST_ID,
  RETRY_AFTER,
} from './openapi.components';
import {
  CALLER_AUTH,
  FORWARDING,
  GENERIC,
  NOT_FOUND,
  oauthError,
  problems,
  UNAVAILABLE,
} from './openapi.problems';
import { OPERATOR_OPERATIONS } from './openapi.operator-paths';

// Nothing in the document depends on configuration: it holds no host, client id or secret.
// test/openapi.e2e-spec.ts validates real answers of running brokers against it.

const TOKEN_EXAMPLE = {
  access_token: 'eyJhbGciOi…',
  token_type: 'Bearer',
  expires_in: 1612,
  expires_at: '2026-11-22T10:30:00.000Z',
};

const CLIENT_QUERY = clientParam(
  'client',
  'query',
  'The provider client (a configured client id). Optional when the caller may use exactly one client, or only one is configured.',
);
const KEY = { type: 'string', minLength: 1, maxLength: 255 };
/** The orders' idempotency codes, which the passthrough answers too. */
const IDEMPOTENCY = Object.values(OrdersErrorCode).filter((code) =>
  code.startsWith('idempotency_'),
);

/** Fastify registers it as `/provider/*`. */
const FORWARD_PATH = '/provider/{client}/{providerPath}';
const FORWARD_ROUTE = '/provider/*';
const FORWARD_METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'];

/** HEAD is described by GET. */
function forwardOperation(method: string): Json {
  return {
    tags: ['passthrough'],
    operationId: `forward${method[0]}${method.slice(1).toLowerCase()}`,
    summary: `Forward a ${method} to the provider with the fleet's token`,
    description:
      "Sent to `{base_url}/{providerPath}?{query}` with the provider's headers and the client's bearer token; the provider's status, safe headers and body come back (streamed). Allowed only where the client's allow-list (`clients[].forward.allow`) lets the method and path pass; `..`, encoded slashes, `//` and the like are refused, never normalised. Requires scope `forward`. On POST, PUT, PATCH and DELETE an `Idempotency-Key` replays the stored answer to a repeat (keys are scoped by method and path). Rate limited per client and per caller (429 `forward_rate_limited`). A provider 429 is passed back with its `Retry-After`.",
    security: BEARER,
    parameters: [
      clientParam('client', 'path', 'The provider client (a configured client id).'),
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
        schema: KEY,
      },
    ],
    ...(['POST', 'PUT', 'PATCH'].includes(method) && {
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
        headers: { ...REQUEST_ID, ...REPLAYED },
        content: { '*/*': { schema: {} } },
      },
      ...problems([...Object.values(ForwardErrorCode), ...IDEMPOTENCY, ...FORWARDING], true),
    },
  };
}

/** Each operation under `METHOD /path`, the path as OpenAPI writes it. */
const OPERATIONS: Record<string, Json> = {
  'GET /token': {
    tags: ['tokens'],
    operationId: 'getToken',
    summary: "The fleet's provider token, from memory",
    security: BEARER,
    parameters: [
      CLIENT_QUERY,
      {
        name: 'min_ttl',
        in: 'query',
        description:
          'Seconds the token must stay valid at least, up to `TOKEN_REFRESH_AHEAD_SECONDS` (tokens are replaced that long before they expire); more is a 400.',
        schema: { type: 'integer', minimum: 0 },
        example: 60,
      },
      {
        name: 'dpop_htm',
        in: 'query',
        description:
          'DPoP clients with `dpop.handOut` only: the method of the one call the caller will make; the answer holds a one-time proof for it (`dpop_proof`). Without it such a client answers 403 `dpop_bound_token`.',
        schema: { type: 'string', enum: ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'] },
      },
      {
        name: 'dpop_htu',
        in: 'query',
        description:
          "With `dpop_htm`: the call's URL, under the client's `baseUrl` (query and fragment are not signed).",
        schema: { type: 'string', format: 'uri' },
      },
    ],
    responses: {
      '200': ok(
        'The token. `expires_in` is the remaining lifetime.',
        ref('TokenResponse'),
        NO_STORE,
        TOKEN_EXAMPLE,
      ),
      ...problems([
        'invalid_request',
        'client_required',
        'dpop_bound_token',
        ...CALLER_AUTH,
        ...NOT_FOUND,
        'method_not_allowed',
        'internal_error',
        ...UNAVAILABLE,
      ]),
    },
  },
  'POST /oauth2/token': {
    tags: ['tokens'],
    operationId: 'oauthToken',
    summary: 'RFC 6749 token endpoint (client credentials) for stock OAuth clients',
    description:
      'Caller authentication: `client_secret_basic` or `client_secret_post` (client id = caller name, secret = API key) in mode `api-key`; an RFC 7523 client assertion (the projected service-account token) in mode `kubernetes`. The provider client: `resource`, else `audience`, else `scope`; implied when the caller may use one client. A DPoP client answers `unauthorized_client` with a description starting `dpop_bound_token:`, unless it has `dpop.handOut` and the request names `dpop_htm` and `dpop_htu`.',
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
      '200': ok(
        'RFC 6749 §5.1 answer.',
        ref('TokenResponse'),
        { ...NO_STORE, Pragma: header('Pragma') },
        TOKEN_EXAMPLE,
      ),
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
        { 'WWW-Authenticate': header('WWW-Authenticate-Basic') },
      ),
      '500': oauthError('Unexpected failure', ['server_error']),
      '503': oauthError('No valid token can be had now', ['temporarily_unavailable'], RETRY_AFTER),
    },
  },
  'GET /.well-known/oauth-authorization-server': {
    tags: ['tokens'],
    operationId: 'oauthMetadata',
    summary:
      'RFC 8414 authorization server metadata (endpoint URLs from OAUTH_ISSUER, else the origin used)',
    responses: {
      '200': ok('The metadata.', ref('AuthorizationServerMetadata'), NO_STORE, {
        issuer: 'http://token-broker',
        token_endpoint: 'http://token-broker/oauth2/token',
        grant_types_supported: ['client_credentials'],
        response_types_supported: [],
        token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post'],
      }),
      ...problems(GENERIC),
    },
  },
  'POST /orders': {
    tags: ['orders'],
    operationId: 'createOrder',
    summary: "Forward an order to the provider with the fleet's token",
    description:
      "The JSON body reaches the provider byte for byte; the provider's status and body come back. With an `Idempotency-Key`, a repeat with the same key and body replays the stored answer instead of creating a second order.",
    security: BEARER,
    parameters: [
      CLIENT_QUERY,
      {
        name: 'Idempotency-Key',
        in: 'header',
        description: '1-255 printable ASCII characters; a new UUID per order.',
        schema: { ...KEY, pattern: '^[\\x21-\\x7e](?:[\\x20-\\x7e]{0,253}[\\x21-\\x7e])?$' },
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
      '2XX': ok(
        "The provider's answer, passed through (201 when it created the order).",
        ref('ProviderAnswer'),
        { ...NO_STORE, ...REPLAYED },
        { id: 'ord_7Hq2', status: 'created' },
      ),
      '4XX': ok(
        "The provider's own refusal, passed through (not problem+json; the broker's refusals below are).",
        ref('ProviderAnswer'),
        { ...REQUEST_ID, ...REPLAYED },
      ),
      ...problems(
        [...Object.values(OrdersErrorCode), 'client_required', 'method_not_allowed', ...FORWARDING],
        true,
      ),
    },
  },
  ...Object.fromEntries(FORWARD_METHODS.map((m) => [`${m} ${FORWARD_PATH}`, forwardOperation(m)])),
  ...OPERATOR_OPERATIONS,
};

/** Built per call: the route keeps only its serialized form, once asked for. */
export function openApiDocument(): Json {
  return {
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
    paths: paths(),
    components: components(),
  };
}

/** The operations grouped by path, each under its lower-case method. */
function paths(): Record<string, Json> {
  const byPath: Record<string, Json> = {};
  for (const [route, operation] of Object.entries(OPERATIONS)) {
    const [method, path] = route.split(' ');
    byPath[path] = { ...byPath[path], [method.toLowerCase()]: operation };
  }
  return byPath;
}

export function describedRoutes(): string[] {
  // Fastify names path parameters `:id` where OpenAPI writes `{id}`.
  return Object.keys(OPERATIONS).map((route) =>
    route.replace(FORWARD_PATH, FORWARD_ROUTE).replace(/\{(\w+)\}/g, ':$1'),
  );
}
