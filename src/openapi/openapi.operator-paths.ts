import {
  BEARER,
  clientParam,
  header,
  type Json,
  NO_STORE,
  ok,
  ref,
  REQUEST_ID,
  type SchemaName,
} from './openapi.components';
import { CALLER_AUTH, type Code, GENERIC, NOT_FOUND, problems } from './openapi.problems';

const ADMIN_CLIENT = clientParam(
  'id',
  'path',
  "The provider client (a configured client id in the caller's grant).",
);

interface AdminOperation {
  operationId: string;
  summary: string;
  answer: string;
  schema: SchemaName;
  codes: Code[];
  /** The path names a client: `{id}`. */
  client?: boolean;
}

function admin({ operationId, summary, answer, schema, codes, client }: AdminOperation): Json {
  return {
    tags: ['admin'],
    operationId,
    summary,
    security: BEARER,
    ...(client && { parameters: [ADMIN_CLIENT] }),
    responses: { '200': ok(answer, ref(schema)), ...problems([...CALLER_AUTH, ...codes]) },
  };
}

/** Its answers, and the problems any route can give. */
function operation(id: string, summary: string, answers: Json): Json {
  const responses = { ...answers, ...problems(GENERIC) };
  return { tags: ['operations'], operationId: id, summary, responses };
}

export const OPERATOR_OPERATIONS: Record<string, Json> = {
  'GET /health/live': operation('live', 'Liveness: the process answers', {
    '200': ok(
      'Alive.',
      { type: 'object', required: ['status'], properties: { status: { const: 'ok' } } },
      REQUEST_ID,
      { status: 'ok' },
    ),
  }),
  'GET /health/ready': operation(
    'ready',
    'Readiness: credentials load and a token was obtained since start-up',
    {
      '200': ok(
        'Ready (Redis down shows as `degraded`, still ready). The report (`info`, `details`) is answered on the admin port only; elsewhere `{"status":"ok"}`.',
        ref('HealthReport'),
        REQUEST_ID,
      ),
      '503': ok(
        'Not ready; on the admin port the report names the cause, elsewhere `{"status":"error"}`.',
        ref('HealthReport'),
      ),
    },
  ),
  'GET /metrics': {
    ...operation(
      'metrics',
      'Prometheus metrics: open on the admin port; without one, a production broker answers the callers\' port only to scope `admin` on every client (`"*"`), a development one to anyone',
      {
        '200': {
          description: 'Prometheus text format 0.0.4.',
          headers: NO_STORE,
          content: { 'text/plain': { schema: { type: 'string' } } },
        },
        ...problems(CALLER_AUTH),
      },
    ),
    security: [{}, ...BEARER],
  },
  'GET /admin/clients': admin({
    operationId: 'adminClients',
    summary: "Every client in the caller's grant, as this replica sees it, and the store",
    answer:
      "Per client: how it asks for its token (`tokenRequest`: `grant` `provider-query` or `rfc6749`, `auth` `client_secret_basic`, `client_secret_post`, `private_key_jwt` or `tls_client_auth`), the token's fingerprint (16 hex of SHA-256, never the token), expiry, when and how this replica last got it (`fetched`, `adopted`, `failed`), the revocation generation, the refresh lock's holder, the last error; and the store's kind, mode, nodes and state.",
    schema: 'AdminStatus',
    codes: GENERIC,
  }),
  'POST /admin/clients/{id}/refresh': admin({
    operationId: 'adminRefresh',
    summary:
      'A new token for the whole fleet: one provider request under the refresh lock, fenced, adopted by every replica',
    answer:
      '`providerRequest` is false when the refresh joined one asked for at the same time (on any replica).',
    schema: 'AdminRefresh',
    codes: [
      ...NOT_FOUND,
      'admin_refresh_failed',
      'admin_store_unavailable',
      'token_unavailable',
      'internal_error',
    ],
    client: true,
  }),
  'POST /admin/clients/{id}/revoke': admin({
    operationId: 'adminRevoke',
    summary:
      "Drops the client's token on every replica for good (a new generation); a new one is fetched",
    answer:
      '`replicas.notified`: replicas the notification reached; `acknowledged`: those that dropped the token within 2 s; `replacement`: the next token, and whether the provider re-issued the revoked one (then revoke it at the provider).',
    schema: 'AdminRevoke',
    codes: [...NOT_FOUND, 'admin_store_unavailable', 'internal_error'],
    client: true,
  }),
  'POST /admin/reload': admin({
    operationId: 'adminReload',
    summary:
      'Re-reads the client list, client credentials and caller grants now, on this replica and (through Redis) every other',
    answer:
      'Names only, for this replica: the clients added, removed or changed, the clients whose credentials changed, the callers added or removed; `replicas`: how many replicas heard the request (each logs its own outcome).',
    schema: 'AdminReload',
    codes: GENERIC,
  }),
  'GET /openapi.json': operation('openapi', 'This document', {
    '200': ok(
      'OpenAPI 3.1.',
      { type: 'object', required: ['openapi', 'paths'] },
      { ...REQUEST_ID, 'Cache-Control': header('Cache-Control-Max-Age') },
    ),
  }),
};
