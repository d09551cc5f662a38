import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRemoteJWKSet, jwtVerify } from 'jose';
import { type AuthServer, introspect, RESOURCE, startAuthServer } from './support/auth-server';
import {
  type Stack,
  type StackBroker,
  type StackClient,
  type StackCredentials,
  startStack,
} from './support/stack';

const INTROSPECTOR = { id: 'introspector', secret: 'introspector-secret-0123456789abcdef' };

interface TokenAnswer {
  access_token: string;
  token_type: string;
  expires_in: number;
}

async function brokerToken(broker: StackBroker, client: string): Promise<TokenAnswer> {
  const res = await fetch(`${broker.url}/token?client=${client}`);
  const text = await res.text();
  if (res.status !== 200) throw new Error(`GET /token?client=${client}: ${res.status} ${text}`);
  return JSON.parse(text) as TokenAnswer;
}

function publicJwk(key: KeyObject, kid: string, alg: string): Record<string, unknown> {
  return { ...key.export({ format: 'jwk' }), kid, alg, use: 'sig' };
}

/**
 * The standard token request profiles (tokenRequest.grant rfc6749) against a real
 * authorization server nobody here wrote: panva's oidc-provider, in its own process. One
 * broker, in the Jest process, serves a client per profile.
 */
describe('standard client-credentials profiles against oidc-provider', () => {
  const es256 = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const ed25519 = generateKeyPairSync('ed25519');
  const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
  let as: AuthServer;
  let stack: Stack;
  let broker: StackBroker;
  /** A resource API behind the passthrough: it answers which client its bearer was issued to. */
  let api: Server;
  let apiUrl: string;

  beforeAll(async () => {
    as = await startAuthServer({
      clients: [
        {
          client_id: 'shop-basic',
          client_secret: 'basic-secret-0123456789abcdef0123',
          token_endpoint_auth_method: 'client_secret_basic',
          scope: 'orders',
        },
        {
          client_id: 'shop-post',
          client_secret: 'post-secret-0123456789abcdef01234',
          token_endpoint_auth_method: 'client_secret_post',
        },
        {
          client_id: 'shop-jwt-es256',
          token_endpoint_auth_method: 'private_key_jwt',
          token_endpoint_auth_signing_alg: 'ES256',
          jwks: { keys: [publicJwk(es256.publicKey, 'es-1', 'ES256')] },
        },
        {
          client_id: 'shop-jwt-eddsa',
          token_endpoint_auth_method: 'private_key_jwt',
          token_endpoint_auth_signing_alg: 'EdDSA',
          jwks: { keys: [publicJwk(ed25519.publicKey, 'ed-1', 'EdDSA')] },
        },
        {
          client_id: 'shop-jwt-ps256',
          token_endpoint_auth_method: 'private_key_jwt',
          token_endpoint_auth_signing_alg: 'PS256',
          jwks: { keys: [publicJwk(rsa.publicKey, 'rsa-1', 'PS256')] },
        },
        {
          client_id: 'shop-jwt-sm',
          token_endpoint_auth_method: 'private_key_jwt',
          token_endpoint_auth_signing_alg: 'ES256',
          jwks: { keys: [publicJwk(es256.publicKey, 'es-1', 'ES256')] },
        },
        {
          client_id: INTROSPECTOR.id,
          client_secret: INTROSPECTOR.secret,
          token_endpoint_auth_method: 'client_secret_basic',
        },
      ],
    });
    api = createServer((req, res) => {
      const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
      req.resume();
      void issuedTo(token).then(
        (clientId) => {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ path: req.url, client_id: clientId }));
        },
        () => res.writeHead(502).end(),
      );
    });
    await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve));
    apiUrl = `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
    const client = (
      id: string,
      credentials: StackCredentials,
      tokenRequest: object,
      more: Partial<StackClient> = {},
    ): StackClient => ({
      id,
      credentials,
      config: {
        authUrl: as.url,
        baseUrl: apiUrl,
        tokenRequest: { grant: 'rfc6749', url: as.tokenUrl, ...tokenRequest },
      },
      ...more,
    });
    stack = await startStack({
      name: 'standard',
      clients: [
        client(
          'basic',
          { client_id: 'shop-basic', client_secret: 'basic-secret-0123456789abcdef0123' },
          { auth: 'client_secret_basic', scope: 'orders', resource: [RESOURCE] },
        ),
        client(
          'post',
          { client_id: 'shop-post', client_secret: 'post-secret-0123456789abcdef01234' },
          { auth: 'client_secret_post' },
        ),
        client(
          'jwt-es256',
          {
            client_id: 'shop-jwt-es256',
            private_key: es256.privateKey.export({ type: 'pkcs8', format: 'pem' }),
          },
          {
            auth: 'private_key_jwt',
            assertion: { alg: 'ES256', kid: 'es-1' },
            resource: [RESOURCE],
          },
        ),
        client(
          'jwt-eddsa',
          // A JWK object in the secret, with its kid.
          {
            client_id: 'shop-jwt-eddsa',
            private_key: { ...ed25519.privateKey.export({ format: 'jwk' }), kid: 'ed-1' },
          },
          { auth: 'private_key_jwt', assertion: { alg: 'EdDSA' } },
        ),
        client(
          'jwt-ps256',
          {
            client_id: 'shop-jwt-ps256',
            private_key: rsa.privateKey.export({ type: 'pkcs1', format: 'pem' }),
          },
          { auth: 'private_key_jwt', assertion: { alg: 'PS256', kid: 'rsa-1' } },
        ),
        // Its key in the stack's Secrets Manager emulator (`token-broker/jwt-sm`), read through
        // the real AWS SDK; the others' in files.
        client(
          'jwt-sm',
          {
            client_id: 'shop-jwt-sm',
            private_key: es256.privateKey.export({ type: 'pkcs8', format: 'pem' }),
          },
          { auth: 'private_key_jwt', assertion: { alg: 'ES256', kid: 'es-1' } },
          { secrets: 'secrets-manager' },
        ),
      ],
      inProcess: true,
      env: { LOG_LEVEL: 'warn', TOKEN_REFRESH_AHEAD_SECONDS: '10' },
    });
    broker = stack.broker;
  });

  /**
   * The client the server issued `token` to: a JWT (a resource indicator was asked for) is
   * verified with the server's JWKS, an opaque token by introspection.
   */
  async function issuedTo(token: string): Promise<unknown> {
    if (token.split('.').length === 3) {
      const { payload } = await jwtVerify(token, createRemoteJWKSet(new URL(`${as.url}/jwks`)), {
        issuer: as.url,
        audience: RESOURCE,
      });
      return payload.client_id;
    }
    const answer = await introspect(as, token, INTROSPECTOR);
    return answer.active === true ? answer.client_id : undefined;
  }

  afterAll(async () => {
    await stack?.close();
    await as?.stop();
    api?.closeAllConnections();
    await new Promise((resolve) => api?.close(resolve));
  });

  it('client_secret_basic with scope and a resource indicator: a JWT for that resource', async () => {
    const answer = await brokerToken(broker, 'basic');
    expect(answer.token_type).toBe('Bearer');
    const { payload } = await jwtVerify(
      answer.access_token,
      createRemoteJWKSet(new URL(`${as.url}/jwks`)),
      { issuer: as.url, audience: RESOURCE },
    );
    expect(payload).toMatchObject({ client_id: 'shop-basic', scope: 'orders' });
  });

  it('client_secret_post: an opaque token the server says is active and its own', async () => {
    const answer = await brokerToken(broker, 'post');
    await expect(introspect(as, answer.access_token, INTROSPECTOR)).resolves.toMatchObject({
      active: true,
      client_id: 'shop-post',
    });
  });

  it.each([
    ['jwt-es256', 'shop-jwt-es256', 'ES256 with a PEM key and a configured kid'],
    ['jwt-eddsa', 'shop-jwt-eddsa', "EdDSA with a JWK and the JWK's own kid"],
    ['jwt-ps256', 'shop-jwt-ps256', 'PS256 with a PKCS#1 PEM key'],
    ['jwt-sm', 'shop-jwt-sm', 'the key read from Secrets Manager through the AWS SDK'],
  ])('private_key_jwt (%s): %s, %s', async (client, clientId) => {
    const answer = await brokerToken(broker, client);
    await expect(issuedTo(answer.access_token)).resolves.toBe(clientId);
  });

  /** Every profile: the broker's client and the server's client it authenticates as. */
  const PROFILES = [
    ['basic', 'shop-basic'],
    ['post', 'shop-post'],
    ['jwt-es256', 'shop-jwt-es256'],
    ['jwt-sm', 'shop-jwt-sm'],
  ];

  it.each(PROFILES)(
    'POST /oauth2/token serves the token the server issued, as GET /token does (%s)',
    async (client, clientId) => {
      const res = await fetch(`${broker.url}/oauth2/token`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        // The scope names the broker's client (mode none has no caller to imply it).
        body: new URLSearchParams({ grant_type: 'client_credentials', scope: client }).toString(),
      });
      expect(res.status).toBe(200);
      const answer = (await res.json()) as TokenAnswer;
      expect(answer.token_type).toBe('Bearer');
      expect(answer.access_token).toBe((await brokerToken(broker, client)).access_token);
      await expect(issuedTo(answer.access_token)).resolves.toBe(clientId);
    },
  );

  it.each(PROFILES)(
    'the passthrough calls the API with the token the server issued for that client (%s)',
    async (client, clientId) => {
      const res = await fetch(`${broker.url}/provider/${client}/api/marketing/v1/offers?x=1`);
      expect(res.status).toBe(200);
      await expect(res.json()).resolves.toEqual({
        path: '/api/marketing/v1/offers?x=1',
        client_id: clientId,
      });
    },
  );

  it('made one token request per client, each accepted', () => {
    const grants = as.grants();
    expect(grants.filter((g) => g.event === 'grant_error')).toEqual([]);
    const perClient = new Map<string, number>();
    for (const g of grants) perClient.set(g.client!, (perClient.get(g.client!) ?? 0) + 1);
    expect(Object.fromEntries(perClient)).toEqual({
      'shop-basic': 1,
      'shop-post': 1,
      'shop-jwt-es256': 1,
      'shop-jwt-eddsa': 1,
      'shop-jwt-ps256': 1,
      'shop-jwt-sm': 1,
    });
  });
});
