// ajv and ajv-formats come with Fastify (its schema compiler), pinned by the lockfile; they
// are not devDependencies because the image ships them as Fastify's.
import Ajv2020 from 'ajv/dist/2020';
import addFormats from 'ajv-formats';
import { CallerAuthErrorCode } from '../src/caller-auth/caller-auth.exception';
import { AdminErrorCode } from '../src/admin/admin.exception';
import { describedRoutes, openApiDocument } from '../src/openapi/openapi';
import { RequestErrorCode } from '../src/http/request.exception';
import { ForwardErrorCode, OrdersErrorCode } from '../src/forwarding/forwarding.exception';
import { OAuthErrorCode } from '../src/token/oauth.exception';
import { TokenErrorCode } from '../src/token/token.exception';
import { CALLER_CLIENTS, UNAVAILABLE_CLIENT } from './support/caller-brokers';
import { type Stack, startStack } from './support/stack';

// The document is walked by path: typed loosely on purpose.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = Record<string, any>;

interface Exchange {
  /** The operation: a path of the document and a method. */
  path: string;
  method: string;
  status: number;
  code?: string;
}

const basic = (id: string, secret: string) =>
  `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`;
/** JSON Pointer escaping of one segment. */
const seg = (s: string) => s.replaceAll('~', '~0').replaceAll('/', '~1');

/**
 * `GET /openapi.json` is one source of truth: the document `src/openapi/openapi.ts` generates,
 * served as is, against which every answer the broker gives here is validated (status declared, media
 * type declared, body valid against the schema with ajv's JSON Schema 2020-12, required headers
 * present and valid, problem `code` among those declared for that status). The routes Fastify
 * registered in the running broker (its start-up debug line; the broker runs in the Jest
 * process) and the document's must be the
 * same set, and every problem code of the `*.exception.ts` enums must be documented.
 */
jest.setTimeout(60_000);

describe('OpenAPI description', () => {
  let set: Stack;
  let doc: Json;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const seen: Exchange[] = [];

  beforeAll(async () => {
    set = await startStack({
      name: 'openapi',
      inProcess: true,
      clients: [...CALLER_CLIENTS, { id: UNAVAILABLE_CLIENT, refused: true }],
      secrets: 'secrets-manager',
      // Every client required: the one that never gets a token shows the not-ready answer.
      env: { READINESS_REQUIRED_CLIENTS: [...CALLER_CLIENTS, UNAVAILABLE_CLIENT].join(',') },
      callerAuth: {
        mode: 'api-key',
        callers: {
          checkout: { clients: ['acme-prod'] },
          ops: { clients: ['*'], scopes: ['token', 'forward', 'admin'] },
        },
      },
    });
    const res = await fetch(`${set.broker.url}/openapi.json`);
    doc = (await res.json()) as Json;
    ajv.addSchema(doc, 'openapi');
  });

  afterAll(async () => {
    await set?.close();
  });

  /** Sends a request and checks its answer against the document's operation `method path`. */
  async function exchange(
    method: string,
    path: string,
    url: string,
    init: RequestInit = {},
  ): Promise<{ status: number; body: unknown }> {
    const res = await fetch(`${set.broker.url}${url}`, { ...init, method });
    const text = await res.text();
    const op = doc.paths[path]?.[method.toLowerCase()] as Json | undefined;
    expect(op).toBeDefined();
    const statusKey = [String(res.status), `${String(res.status)[0]}XX`].find(
      (k) => op!.responses[k],
    );
    if (!statusKey) throw new Error(`${method} ${path}: status ${res.status} is not documented`);
    const response = op!.responses[statusKey] as Json;
    const mediaType = (res.headers.get('content-type') ?? '').split(';')[0].trim();
    if (!response.content?.[mediaType]) {
      throw new Error(
        `${method} ${path} ${res.status}: media type ${mediaType} not documented (${Object.keys(response.content ?? {}).join(', ')})`,
      );
    }
    const body: unknown = mediaType.endsWith('json') ? JSON.parse(text) : text;
    if (response.content[mediaType].schema) {
      const pointer = ['paths', path, method.toLowerCase(), 'responses', statusKey, 'content']
        .concat(mediaType, 'schema')
        .map(seg)
        .join('/');
      const validate = ajv.getSchema(`openapi#/${pointer}`)!;
      if (!validate(body)) {
        throw new Error(
          `${method} ${path} ${res.status}: body does not match the schema: ${ajv.errorsText(validate.errors)}\n${text.slice(0, 300)}`,
        );
      }
    }
    for (const [name, h] of Object.entries((response.headers ?? {}) as Json)) {
      const definition = (
        h.$ref ? doc.components.headers[String(h.$ref).split('/').pop()!] : h
      ) as Json;
      const value = res.headers.get(name);
      if (definition.required) {
        expect({ header: name, present: value !== null }).toEqual({ header: name, present: true });
      }
      if (value !== null && definition.schema) {
        const ok = ajv.validate(definition.schema as object, value);
        expect({ header: name, value, ok }).toEqual({ header: name, value, ok: true });
      }
    }
    // A problem's `code`, or an RFC 6749 `error` (a health report's `error` is an object).
    const { code, error } = (body ?? {}) as { code?: unknown; error?: unknown };
    const named = [code, error].find((c): c is string => typeof c === 'string');
    seen.push({ path, method, status: res.status, code: named });
    return { status: res.status, body };
  }

  const ops = () => ({ authorization: `Bearer ${set.keys.ops}` });
  const checkout = () => ({ authorization: `Bearer ${set.keys.checkout}` });
  const json = { 'content-type': 'application/json' };
  const form = { 'content-type': 'application/x-www-form-urlencoded' };

  it('is the checked-in document, served without caller auth, with nothing of the configuration', async () => {
    const res = await fetch(`${set.broker.url}/openapi.json`);
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(JSON.parse(text)).toEqual(openApiDocument());
    expect(doc.openapi).toBe('3.1.0');
    for (const leak of [
      ...set.secretValues,
      set.provider.url,
      set.secrets!.url,
      String(set.broker.port),
      'merchant',
      'initech',
    ]) {
      expect(text).not.toContain(leak);
    }
  });

  it('GET /token: every status and code it gives matches the document', async () => {
    const t = (query: string, headers: Record<string, string> = {}) =>
      exchange('GET', '/token', `/token${query}`, { headers });
    expect((await t('?client=acme-prod', checkout())).status).toBe(200);
    expect((await t('', ops())).status).toBe(400); // client_required
    expect((await t('?client=acme-prod&min_ttl=soon', ops())).status).toBe(400);
    expect((await t('?client=acme-prod')).status).toBe(401);
    expect((await t('?client=globex-prod', checkout())).status).toBe(403);
    expect((await t('?client=nope-prod', ops())).status).toBe(404);
    expect((await t('?client=initech-prod', ops())).status).toBe(503);
  });

  it('POST /oauth2/token and the RFC 8414 metadata', async () => {
    const o = (body: string, headers: Record<string, string> = {}) =>
      exchange('POST', '/oauth2/token', '/oauth2/token', {
        headers: { ...form, ...headers },
        body,
      });
    const auth = { authorization: basic('ops', set.keys.ops) };
    expect((await o('grant_type=client_credentials&resource=acme-prod', auth)).status).toBe(200);
    expect((await o('grant_type=password', auth)).status).toBe(400);
    expect((await o('grant_type=client_credentials&scope=nope', auth)).status).toBe(400);
    expect((await o('grant_type=client_credentials&resource=nope', auth)).status).toBe(400);
    expect((await o('grant_type=client_credentials')).status).toBe(401);
    expect(
      (
        await o('grant_type=client_credentials&resource=globex-prod', {
          authorization: basic('checkout', set.keys.checkout),
        })
      ).status,
    ).toBe(400); // unauthorized_client
    expect((await o('grant_type=client_credentials&resource=initech-prod', auth)).status).toBe(503);
    const meta = '/.well-known/oauth-authorization-server';
    expect((await exchange('GET', meta, meta)).status).toBe(200);
  });

  it('POST /orders: created, replayed, the provider’s own refusal and the broker’s', async () => {
    const order = (
      body: string,
      headers: Record<string, string> = {},
      query = '?client=acme-prod',
    ) =>
      exchange('POST', '/orders', `/orders${query}`, {
        headers: { ...json, ...checkout(), ...headers },
        body,
      });
    const good = JSON.stringify({ amount: 1999, currency: 'EUR', reference: 'cart-1' });
    const key = { 'idempotency-key': `k-${Date.now()}` };
    expect((await order(good, key)).status).toBe(201);
    expect((await order(good, key)).status).toBe(201); // replayed
    expect((await order(JSON.stringify({ amount: 5 }), key)).status).toBe(422); // reused
    expect((await order('{"price":5}')).status).toBe(422); // the provider's own refusal
    expect((await order('{not json')).status).toBe(400);
    expect((await order(good, { 'idempotency-key': 'k'.repeat(300) })).status).toBe(400);
    expect((await order(good, { 'content-type': 'text/plain' })).status).toBe(415);
    expect((await order(good, { authorization: 'Bearer nope' })).status).toBe(401);
    expect((await order(good, {}, '?client=globex-prod')).status).toBe(403);
    expect(
      (await order(good, { authorization: `Bearer ${set.keys.ops}` }, '?client=nope')).status,
    ).toBe(404);
    expect((await order(`{"pad":"${'x'.repeat(1_100_000)}"}`)).status).toBe(413);
    expect(
      (await order(good, { authorization: `Bearer ${set.keys.ops}` }, '?client=initech-prod'))
        .status,
    ).toBe(503);
  });

  it('health, metrics, this document, and an unknown route', async () => {
    expect((await exchange('GET', '/health/live', '/health/live')).status).toBe(200);
    // initech-prod never gets a token and is required: not ready, as the document says it looks.
    expect((await exchange('GET', '/health/ready', '/health/ready')).status).toBe(503);
    expect((await exchange('GET', '/metrics', '/metrics')).status).toBe(200);
    expect((await exchange('GET', '/openapi.json', '/openapi.json')).status).toBe(200);
    // Any route: a path nothing serves is the documented 404 not_found.
    expect((await exchange('GET', '/metrics', '/metrics/nope')).status).toBe(404);
    expect((await exchange('GET', '/token', '/token/')).status).toBe(404);
  });

  it('the admin routes (on the API port here: no ADMIN_PORT)', async () => {
    const status = await exchange('GET', '/admin/clients', '/admin/clients', { headers: ops() });
    expect(status.status).toBe(200);
    // Each client says how it asks for its token (the provider's dialect by default).
    const { clients } = status.body as { clients: Array<{ tokenRequest: unknown }> };
    for (const client of clients) {
      expect(client.tokenRequest).toEqual({ grant: 'provider-query', auth: 'client_secret_basic' });
    }
    expect((await exchange('GET', '/admin/clients', '/admin/clients')).status).toBe(401);
    expect(
      (await exchange('GET', '/admin/clients', '/admin/clients', { headers: checkout() })).status,
    ).toBe(403);
    const refresh = '/admin/clients/{id}/refresh';
    expect(
      (await exchange('POST', refresh, '/admin/clients/acme-prod/refresh', { headers: ops() }))
        .status,
    ).toBe(200);
    expect(
      (await exchange('POST', refresh, '/admin/clients/nope/refresh', { headers: ops() })).status,
    ).toBe(404);
    // The provider refuses initech-prod's credentials.
    expect(
      (await exchange('POST', refresh, '/admin/clients/initech-prod/refresh', { headers: ops() }))
        .status,
    ).toBe(502);
    expect(
      (
        await exchange('POST', '/admin/clients/{id}/revoke', '/admin/clients/acme-prod/revoke', {
          headers: ops(),
        })
      ).status,
    ).toBe(200);
    expect(
      (await exchange('POST', '/admin/reload', '/admin/reload', { headers: ops() })).status,
    ).toBe(200);
  });

  it('every answer above had its problem code declared for its status', () => {
    for (const e of seen.filter((x) => x.status >= 400 && x.code)) {
      const op = doc.paths[e.path][e.method.toLowerCase()];
      const response = op.responses[String(e.status)];
      expect({
        ...e,
        declared: (response.description as string).includes(`\`${e.code}\``),
      }).toEqual({
        ...e,
        declared: true,
      });
    }
    expect(seen.length).toBeGreaterThan(30);
  });

  it("documents every route the broker serves (Fastify's and GET /token's front), and only those", () => {
    const line = set.broker.logs().find((l) => l.includes('routes registered: '));
    expect(line).toBeDefined();
    const msg = (JSON.parse(line!) as { msg: string }).msg;
    const registered = JSON.parse(msg.slice(msg.indexOf('['))) as string[];
    expect([...registered].sort()).toEqual([...describedRoutes()].sort());
    expect(registered).toEqual(expect.arrayContaining(['GET /token', 'POST /oauth2/token']));
    expect(set.broker.logs().filter((l) => l.includes('is out of date'))).toEqual([]);
  });

  it('documents every problem and OAuth error code the broker has', () => {
    const text = JSON.stringify(openApiDocument());
    const codes = [
      ...Object.values(TokenErrorCode),
      ...Object.values(CallerAuthErrorCode),
      ...Object.values(RequestErrorCode),
      ...Object.values(OrdersErrorCode),
      ...Object.values(AdminErrorCode),
      ...Object.values(ForwardErrorCode),
      ...Object.values(OAuthErrorCode),
      'internal_error',
    ];
    const missing = codes.filter((c) => !text.includes(`\`${c}\``));
    expect(missing).toEqual([]);
  });
});
