/**
 * @alone: it times brokers under load; no other suite runs beside it (scripts/test.mjs).
 */
import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type AuthServer, RESOURCE, startAuthServer } from './support/auth-server';
import { requestsPerCycle } from './support/fleet';
import { hammer, type HammerResult } from './support/load';
import { type Stack, startStack } from './support/stack';

const LIFETIME_S = 4;
const AHEAD_S = 1;
const LIFETIMES = 6;
const CLIENT = 'dpop';
/** Its key from a file, and it hands tokens out with a one-time proof. */
const HAND_OUT = 'dpop-out';
const AS_CLIENTS = { [CLIENT]: 'fleet-dpop', [HAND_OUT]: 'fleet-dpop-out' } as const;
const secretOf = (clientId: string) => `${clientId}-secret-0123456789abcdef0123`;
const b64sha256 = (text: string) => createHash('sha256').update(text).digest('base64url');

/** What the resource server saw of one proof it accepted, or why it refused one. */
interface Seen {
  replica: string;
  client: string;
  jkt: string;
}

/**
 * An API that accepts DPoP-bound tokens only (RFC 9449 §7): it verifies every proof with jose
 * (signature under the embedded key, `typ`, `htm`, `htu`, `ath`, `iat` within 10 s, `jti` never
 * seen before, its current nonce) and the token (a JWT of the authorization server for
 * {@link RESOURCE}, whose `cnf.jkt` must be the proof key's thumbprint). A stale or missing
 * nonce is answered `use_dpop_nonce` with the current one; anything else wrong is recorded.
 */
class ResourceServer {
  url = '';
  nonce = randomBytes(16).toString('base64url');
  readonly failures: string[] = [];
  readonly accepted: Seen[] = [];
  challenges = 0;
  private readonly jtis = new Set<string>();
  private server?: Server;

  constructor(private readonly as: AuthServer) {}

  async start(): Promise<void> {
    const jose = await import('jose');
    const jwks = jose.createRemoteJWKSet(new URL(this.as.jwksUrl));
    this.server = createServer((req, res) => {
      void this.handle(jose, jwks, req, res).catch((err: Error) => {
        this.failures.push(`handler: ${err.message}`);
        res.writeHead(500).end();
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  rotateNonce(): void {
    this.nonce = randomBytes(16).toString('base64url');
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise((resolve) => this.server?.close(resolve));
  }

  private async handle(
    jose: typeof import('jose'),
    jwks: ReturnType<typeof import('jose').createRemoteJWKSet>,
    req: IncomingMessage,
    res: ServerResponse,
  ): Promise<void> {
    for await (const _ of req) void _;
    const path = new URL(req.url!, this.url).pathname;
    const fail = (why: string) => {
      this.failures.push(`${req.method} ${path}: ${why}`);
      res.writeHead(401, { 'www-authenticate': 'DPoP error="invalid_token"' }).end();
    };
    const auth = req.headers.authorization ?? '';
    if (!auth.startsWith('DPoP ')) return fail(`scheme of "${auth.split(' ')[0]}"`);
    const token = auth.slice('DPoP '.length);
    const proof = req.headers.dpop;
    if (typeof proof !== 'string') return fail('no DPoP header');
    let payload: import('jose').JWTPayload;
    let header: import('jose').JWTHeaderParameters;
    try {
      ({ payload, protectedHeader: header } = await jose.jwtVerify(proof, jose.EmbeddedJWK, {
        typ: 'dpop+jwt',
        algorithms: ['ES256', 'EdDSA', 'PS256', 'RS256'],
      }));
    } catch (err) {
      return fail(`proof: ${(err as Error).message}`);
    }
    if (payload.htm !== req.method) return fail(`htm ${String(payload.htm)}`);
    if (payload.htu !== `${this.url}${path}`) return fail(`htu ${String(payload.htu)}`);
    if (payload.ath !== b64sha256(token)) return fail('ath');
    if (typeof payload.iat !== 'number' || Math.abs(Date.now() / 1000 - payload.iat) > 10) {
      return fail(`iat ${payload.iat}`);
    }
    if (typeof payload.jti !== 'string' || this.jtis.has(payload.jti)) return fail('jti replayed');
    this.jtis.add(payload.jti);
    if (payload.nonce !== this.nonce) {
      this.challenges++;
      res
        .writeHead(401, {
          'www-authenticate': 'DPoP error="use_dpop_nonce", error_description="use the nonce"',
          'dpop-nonce': this.nonce,
        })
        .end();
      return;
    }
    let claims: import('jose').JWTPayload;
    try {
      ({ payload: claims } = await jose.jwtVerify(token, jwks, {
        issuer: this.as.url,
        audience: RESOURCE,
      }));
    } catch (err) {
      return fail(`token: ${(err as Error).message}`);
    }
    const jkt = await jose.calculateJwkThumbprint(header.jwk!);
    const cnf = claims.cnf as { jkt?: string } | undefined;
    if (cnf?.jkt !== jkt) return fail(`cnf.jkt ${cnf?.jkt} is not the proof key's ${jkt}`);
    // `/api/marketing/v1/<client>/<replica>`: who sent it.
    const [, , , , client = '', replica = ''] = path.split('/');
    this.accepted.push({ replica, client, jkt });
    // A provider endpoint that echoes the Authorization header it was sent.
    const answer =
      replica === 'echo' ? JSON.stringify({ debug: { authorization: auth } }) : '{"ok":true}';
    res.writeHead(200, { 'content-type': 'application/json' }).end(answer);
  }
}

/**
 * DPoP as a fleet holds it: three replicas sharing one Redis on a client whose key none was
 * given (generated once, sealed in Redis), against oidc-provider with DPoP and nonces required
 * and an API that verifies every proof. One token request per lifetime, every replica's proofs
 * valid and for one key, and both servers' nonce rotations survived without a failed call.
 */
describe('fleet of 3 brokers on a DPoP client (oidc-provider, nonces required)', () => {
  let as: AuthServer;
  let rs: ResourceServer;
  let stack: Stack;
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'tb-dpop-'));
    as = await startAuthServer({
      ttlSeconds: LIFETIME_S,
      dpop: true,
      clients: Object.values(AS_CLIENTS).map((clientId) => ({
        client_id: clientId,
        client_secret: secretOf(clientId),
        token_endpoint_auth_method: 'client_secret_basic',
        dpop_bound_access_tokens: true,
      })),
    });
    rs = new ResourceServer(as);
    await rs.start();
    const keyFile = join(dir, 'dpop-key.pem');
    writeFileSync(
      keyFile,
      generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }),
      { mode: 0o600 },
    );
    const client = (id: keyof typeof AS_CLIENTS, dpop: Record<string, unknown>) => ({
      id,
      credentials: { client_id: AS_CLIENTS[id], client_secret: secretOf(AS_CLIENTS[id]) },
      config: {
        authUrl: as.url,
        baseUrl: rs.url,
        tokenRequest: { grant: 'rfc6749', url: as.tokenUrl, resource: [RESOURCE] },
        dpop,
      },
    });
    stack = await startStack({
      name: 'dpop',
      clients: [
        client(CLIENT, { key: { generate: true } }),
        client(HAND_OUT, { key: { file: keyFile }, alg: 'EdDSA', handOut: true }),
      ],
      redis: 'standalone',
      cacheKey: true,
      replicas: 3,
      callerAuth: {
        mode: 'api-key',
        callers: {
          shop: { clients: [CLIENT, HAND_OUT], scopes: ['token', 'forward'] },
          relay: { clients: [CLIENT, HAND_OUT], scopes: ['forward'] },
        },
      },
      env: {
        LOG_LEVEL: 'warn',
        TOKEN_REFRESH_AHEAD_SECONDS: String(AHEAD_S),
        TOKEN_DEFAULT_LIFETIME_SECONDS: String(LIFETIME_S),
        FORWARD_CLIENT_RATE_PER_SECOND: '100000',
        FORWARD_CLIENT_RATE_BURST: '100000',
        FORWARD_CALLER_RATE_PER_SECOND: '100000',
        FORWARD_CALLER_RATE_BURST: '100000',
      },
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
    await rs?.stop();
    await as?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const as_ = (caller: 'shop' | 'relay') => ({ authorization: `Bearer ${stack.keys[caller]}` });

  it(`forwards with a valid proof from every replica for one key over ${LIFETIMES} lifetimes, through both servers' nonce rotations, at one token request per lifetime`, async () => {
    const durationMs = LIFETIME_S * LIFETIMES * 1000;
    const rotations = [
      setTimeout(() => rs.rotateNonce(), durationMs / 3),
      setTimeout(() => void as.rotateDpopNonce(), durationMs / 2),
      setTimeout(() => rs.rotateNonce(), (2 * durationMs) / 3),
    ];
    let results: HammerResult[];
    try {
      results = await Promise.all(
        stack.brokers.flatMap((broker, replica) => [
          hammer({
            urls: [broker.url],
            path: `/provider/${CLIENT}/api/marketing/v1/${CLIENT}/${replica}`,
            headers: as_('relay'),
            concurrency: 2,
            durationMs,
          }),
        ]),
      );
    } finally {
      rotations.forEach(clearTimeout);
    }

    const grants = as.grants().filter((g) => g.client === AS_CLIENTS[CLIENT]);
    const times = grants.filter((g) => g.event === 'grant').map((g) => g.at);
    const cycles = requestsPerCycle(times, (LIFETIME_S - AHEAD_S - 0.25) * 1000 * 0.5);
    const mine = rs.accepted.filter((s) => s.client === CLIENT);
    const byReplica = ['0', '1', '2'].map((r) => mine.filter((s) => s.replica === r).length);
    const calls = results.reduce((n, r) => n + r.calls, 0);
    console.log(
      [
        `dpop fleet: ${calls} forwarded calls, ${results.reduce((n, r) => n + r.failureCount, 0)} failed, ${rs.challenges} nonce challenges at the API`,
        `accepted per replica: ${byReplica.join(', ')}; key thumbprints: ${[...new Set(mine.map((s) => s.jkt))].join(', ')}`,
        `${times.length} token requests in ${cycles.length} cycles (max ${Math.max(...cycles)} per cycle); grant errors: ${grants
          .filter((g) => g.event === 'grant_error')
          .map((g) => g.error)
          .join(', ')}`,
      ].join('\n'),
    );
    expect(results.flatMap((r) => r.failures)).toEqual([]);
    expect(rs.failures).toEqual([]);
    expect(byReplica.every((n) => n > 50)).toBe(true);
    expect(new Set(mine.map((s) => s.jkt)).size).toBe(1);
    // Both rotations (and the first call of each replica) cost a nonce challenge, each retried.
    expect(rs.challenges).toBeGreaterThanOrEqual(2);
    expect(cycles.length).toBeGreaterThanOrEqual(LIFETIMES);
    expect(Math.max(...cycles)).toBe(1);
    // The server's rotation was met with use_dpop_nonce, learnt and retried: not a failure.
    expect(
      grants.filter((g) => g.event === 'grant_error').every((g) => g.error === 'use_dpop_nonce'),
    ).toBe(true);
    expect(as.grants().some((g) => (g.event as string) === 'nonce_rotated')).toBe(true);
  }, 120_000);

  it('keeps the generated key across a restart: a replica started later signs with the same key', async () => {
    const later = await stack.addBroker();
    const res = await fetch(`${later.url}/provider/${CLIENT}/api/marketing/v1/${CLIENT}/later`, {
      headers: as_('relay'),
    });
    expect(res.status).toBe(200);
    const jkts = new Set(rs.accepted.filter((s) => s.client === CLIENT).map((s) => s.jkt));
    expect(rs.accepted.at(-1)).toMatchObject({ replica: 'later', client: CLIENT });
    expect(jkts.size).toBe(1);
  });

  it('sends POST /orders with a proof of its own for the orders path', async () => {
    const before = rs.accepted.length;
    const res = await fetch(`${stack.brokers[1].url}/orders?client=${CLIENT}`, {
      method: 'POST',
      headers: {
        ...as_('relay'),
        'content-type': 'application/json',
        'idempotency-key': 'dpop-order-1',
      },
      body: JSON.stringify({ price: 50_000, orderRef: 'dpop-1' }),
    });
    expect(res.status).toBe(200);
    // `/api/checkout/v1/orders`: the proof's htm POST and htu the orders URL were verified.
    expect(rs.accepted.slice(before)).toEqual([expect.objectContaining({ client: 'orders' })]);
    expect(rs.failures).toEqual([]);
  });

  it('withholds an API answer that echoes the DPoP-bound token from a forward-only caller', async () => {
    const res = await fetch(
      `${stack.brokers[0].url}/provider/${CLIENT}/api/marketing/v1/${CLIENT}/echo`,
      {
        headers: as_('relay'),
      },
    );
    const text = await res.text();
    expect(res.status).toBe(502);
    expect((JSON.parse(text) as { code: string }).code).toBe('forward_upstream_echoed_token');
    expect(text).not.toMatch(/DPoP ey/);
  });

  it('refuses GET /token and POST /oauth2/token for a DPoP client with dpop_bound_token, to a token caller and a forward-only caller alike', async () => {
    for (const caller of ['shop', 'relay'] as const) {
      const res = await fetch(`${stack.brokers[0].url}/token?client=${CLIENT}`, {
        headers: as_(caller),
      });
      const problem = (await res.json()) as { code: string; detail: string };
      expect({ caller, status: res.status, code: problem.code }).toEqual({
        caller,
        status: 403,
        code: 'dpop_bound_token',
      });
      expect(problem.detail).toContain(`/provider/${CLIENT}/`);
    }
    const oauth = await fetch(`${stack.brokers[1].url}/oauth2/token`, {
      method: 'POST',
      headers: {
        authorization: `Basic ${Buffer.from(`shop:${stack.keys.shop}`).toString('base64')}`,
        'content-type': 'application/x-www-form-urlencoded',
      },
      body: `grant_type=client_credentials&resource=${CLIENT}`,
    });
    const error = (await oauth.json()) as { error: string; error_description: string };
    expect({ status: oauth.status, error: error.error }).toEqual({
      status: 400,
      error: 'unauthorized_client',
    });
    expect(error.error_description).toMatch(/^dpop_bound_token: /);
  });

  it('hands a token caller of an opted-in client the token with a one-time proof for the call it names, which the API accepts once', async () => {
    const url = `${rs.url}/api/marketing/v1/${HAND_OUT}/caller`;
    // The broker learns the API's nonce on a call of its own first (the caller cannot re-sign).
    const warm = await fetch(`${stack.brokers[2].url}/provider/${HAND_OUT}/api/marketing/v1/x/y`, {
      headers: as_('shop'),
    });
    expect(warm.status).toBe(200);
    const res = await fetch(
      `${stack.brokers[2].url}/token?client=${HAND_OUT}&dpop_htm=GET&dpop_htu=${encodeURIComponent(url)}`,
      { headers: as_('shop') },
    );
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, string>;
    expect(body).toMatchObject({ token_type: 'DPoP', dpop_htm: 'GET', dpop_htu: url });
    const call = () =>
      fetch(url, {
        headers: { authorization: `DPoP ${body.access_token}`, dpop: body.dpop_proof },
      });
    const failuresBefore = rs.failures.length;
    expect((await call()).status).toBe(200);
    // One-time: the API refuses the same proof again.
    expect((await call()).status).toBe(401);
    expect(rs.failures.slice(failuresBefore)).toEqual([
      `GET /api/marketing/v1/${HAND_OUT}/caller: jti replayed`,
    ]);
    rs.failures.splice(failuresBefore);

    // A forward-only caller gets no token, opted in or not; a URL off the API is refused.
    const relay = await fetch(
      `${stack.brokers[0].url}/token?client=${HAND_OUT}&dpop_htm=GET&dpop_htu=${encodeURIComponent(url)}`,
      { headers: as_('relay') },
    );
    expect(((await relay.json()) as { code: string }).code).toBe('dpop_bound_token');
    const elsewhere = await fetch(
      `${stack.brokers[0].url}/token?client=${HAND_OUT}&dpop_htm=GET&dpop_htu=${encodeURIComponent('https://evil.example/x')}`,
      { headers: as_('shop') },
    );
    expect(elsewhere.status).toBe(400);
  });
});
