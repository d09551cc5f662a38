import { createHmac } from 'node:crypto';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { SignJWT } from 'jose';
import { ServiceAccountIssuer } from '../../emulator/service-account-issuer';
import type { Caller } from './caller';
import { CallerAuthErrorCode, CallerAuthException } from './caller-auth.exception';
import { KubernetesAuthenticator } from './kubernetes.authenticator';
import { remoteServiceAccountKeys } from './service-account-keys';

const CHECKOUT = 'system:serviceaccount:shop:checkout';
const BILLING = 'system:serviceaccount:shop:billing';
const STRANGER = 'system:serviceaccount:other:stranger';

async function outcome(result: Caller | Promise<Caller>): Promise<Caller | CallerAuthException> {
  try {
    return await result;
  } catch (err) {
    if (err instanceof CallerAuthException) return err;
    throw err;
  }
}

function b64(json: unknown): string {
  return Buffer.from(JSON.stringify(json)).toString('base64url');
}

// Jest applies `testTimeout` only at the top level of its config, not per project, and
// starting processes (or generating RSA keys) can take seconds on a busy machine.
jest.setTimeout(30_000);

describe(KubernetesAuthenticator.name, () => {
  let issuer: ServiceAccountIssuer;
  let fetchFailures: unknown[];

  function authenticator(
    overrides: {
      cacheSize?: number;
      jwksUrl?: string;
      currentSubjects?: () => Record<
        string,
        { clients: string[]; scopes: ('token' | 'forward')[] }
      >;
    } = {},
  ): KubernetesAuthenticator {
    const keys = remoteServiceAccountKeys(overrides.jwksUrl ?? issuer.jwksUrl, {
      cooldownMs: 30_000,
      failureBackoffMs: 60_000,
      onFetchFailure: (err) => fetchFailures.push(err),
    });
    return new KubernetesAuthenticator({
      issuer: issuer.issuer,
      audience: 'token-broker',
      subjects: {
        [CHECKOUT]: { clients: ['acme-prod'], scopes: ['token', 'forward'] },
        [BILLING]: { clients: ['*'], scopes: ['forward'] },
      },
      getKey: keys.getKey,
      cacheSize: overrides.cacheSize ?? 100,
      clockToleranceSeconds: 5,
      maxTokenLifetimeSeconds: 48 * 3600,
      currentSubjects: overrides.currentSubjects,
    });
  }

  let requestsBefore: number;
  /** JWKS requests since the test started (the issuer is shared: key generation is slow). */
  const jwksRequests = () => issuer.jwksRequests - requestsBefore;

  beforeAll(async () => {
    issuer = await ServiceAccountIssuer.start();
  });

  beforeEach(() => {
    fetchFailures = [];
    issuer.failJwks(null);
    requestsBefore = issuer.jwksRequests;
  });

  afterAll(async () => {
    await issuer.close();
  });

  it.each(['RS256', 'ES256'] as const)(
    'accepts a %s projected token and maps its subject to the granted clients',
    async (alg) => {
      const auth = authenticator();
      const caller = await auth.authenticate(
        `Bearer ${await issuer.token({ subject: CHECKOUT, alg })}`,
      );
      expect(caller).toEqual({
        name: CHECKOUT,
        clients: new Set(['acme-prod']),
        scopes: new Set(['token', 'forward']),
      });
    },
  );

  it("takes a reloaded configuration's grants, also for a token verified before", async () => {
    let subjects = {
      [CHECKOUT]: { clients: ['acme-prod'], scopes: ['token' as const] },
    };
    const auth = authenticator({ currentSubjects: () => subjects });
    const header = `Bearer ${await issuer.token({ subject: CHECKOUT })}`;
    expect(await auth.authenticate(header)).toMatchObject({ clients: new Set(['acme-prod']) });
    expect(await auth.reloadNow()).toEqual({ added: [CHECKOUT], removed: [BILLING] });
    subjects = { [CHECKOUT]: { clients: ['acme-prod', 'globex-prod'], scopes: ['token'] } };
    expect(await auth.reloadNow()).toEqual({ added: [CHECKOUT], removed: [] });
    expect(await auth.authenticate(header)).toMatchObject({
      clients: new Set(['acme-prod', 'globex-prod']),
    });
    expect(await auth.reloadNow()).toEqual({ added: [], removed: [] });
  });

  it('answers a repeat synchronously from the cache, and shares one verification between concurrent firsts', async () => {
    const auth = authenticator();
    const header = `Bearer ${await issuer.token({ subject: BILLING })}`;
    const first = [auth.authenticate(header), auth.authenticate(header), auth.authenticate(header)];
    expect(first.every((r) => r instanceof Promise)).toBe(true);
    expect(first[0]).toBe(first[1]);
    const caller = await first[0];
    expect(caller).toEqual({ name: BILLING, clients: '*', scopes: new Set(['forward']) });
    const again = auth.authenticate(header);
    expect(again).not.toBeInstanceOf(Promise);
    expect(again).toBe(caller);
    expect(jwksRequests()).toBe(1);
  });

  it('gives a verified service account without a grant a caller with no clients (a 403, not a 401)', async () => {
    const caller = await authenticator().authenticate(
      `Bearer ${await issuer.token({ subject: STRANGER })}`,
    );
    expect(caller.name).toBe(STRANGER);
    expect(caller.clients).toEqual(new Set());
  });

  const badTokens: Array<[string, () => Promise<string>, RegExp]> = [
    ['expired', () => issuer.token({ subject: CHECKOUT, expiresInSeconds: -60 }), /expired/],
    [
      'without exp',
      () => issuer.token({ subject: CHECKOUT, expiresInSeconds: null }),
      /"exp" claim/,
    ],
    [
      'without iat (its lifetime cannot be judged)',
      () => issuer.token({ subject: CHECKOUT, issuedAtSeconds: null }),
      /"iat" claim is not accepted \(missing\)/,
    ],
    [
      'living longer than the 48 h accepted',
      () => issuer.token({ subject: CHECKOUT, expiresInSeconds: 48 * 3600 + 1 }),
      /lifetime \(exp - iat\) is 172801 s, over the 172800 s accepted \(CALLER_AUTH_MAX_TOKEN_LIFETIME_SECONDS\)/,
    ],
    [
      'issued a year ago, with an hour left (a legacy long-lived token)',
      () =>
        issuer.token({ subject: CHECKOUT, issuedAtSeconds: -365 * 86_400, expiresInSeconds: 3600 }),
      /lifetime \(exp - iat\) is 31539600 s, over the 172800 s accepted/,
    ],
    [
      'issued in the future beyond the clock tolerance (exp - iat would understate its life)',
      () =>
        issuer.token({
          subject: CHECKOUT,
          issuedAtSeconds: 47 * 3600,
          expiresInSeconds: 48 * 3600,
        }),
      /issued \d+ s in the future \(its "iat"\), beyond the 5 s of clock skew accepted/,
    ],
    [
      'for another audience',
      () => issuer.token({ subject: CHECKOUT, audience: 'vault' }),
      /"aud" claim/,
    ],
    [
      'from another issuer',
      () => issuer.token({ subject: CHECKOUT, issuer: 'https://evil.example' }),
      /"iss" claim/,
    ],
    [
      'signed with an unknown key',
      () => issuer.token({ subject: CHECKOUT, unpublishedKey: true }),
      /does not publish/,
    ],
    [
      'not a service account',
      () => issuer.token({ subject: 'admin' }),
      /not a Kubernetes service-account token/,
    ],
    [
      'with alg none',
      async () => {
        const [, payload] = (await issuer.token({ subject: CHECKOUT })).split('.');
        return `${b64({ alg: 'none', typ: 'JWT' })}.${payload}.`;
      },
      /algorithm is not accepted|not a well-formed/,
    ],
    [
      'with a tampered payload',
      async () => {
        const [header, , signature] = (await issuer.token({ subject: CHECKOUT })).split('.');
        const forged = b64({
          iss: issuer.issuer,
          sub: BILLING,
          aud: ['token-broker'],
          exp: Math.floor(Date.now() / 1000) + 3600,
        });
        return `${header}.${forged}.${signature}`;
      },
      /signature does not verify/,
    ],
    [
      'with a tampered signature',
      async () => {
        const token = await issuer.token({ subject: CHECKOUT, alg: 'RS256' });
        const last = token.at(-2) === 'A' ? 'B' : 'A';
        return `${token.slice(0, -2)}${last}${token.at(-1)}`;
      },
      /signature does not verify/,
    ],
    [
      'HS256-signed with the public key (key confusion)',
      async () => {
        const jwk = issuer.publicJwks.find((k) => k.kty === 'RSA')!;
        const secret = new TextEncoder().encode(JSON.stringify(jwk));
        return new SignJWT({ sub: CHECKOUT, aud: 'token-broker', iss: issuer.issuer })
          .setProtectedHeader({ alg: 'HS256', kid: jwk.kid })
          .setExpirationTime('1h')
          .sign(secret);
      },
      /algorithm is not accepted/,
    ],
    [
      'HS256 by hand with the PEM-ish key bytes',
      async () => {
        const jwk = issuer.publicJwks[0];
        const head = b64({ alg: 'HS256', kid: jwk.kid });
        const body = b64({ sub: CHECKOUT, aud: 'token-broker', iss: issuer.issuer, exp: 9e9 });
        const sig = createHmac('sha256', String(jwk.n))
          .update(`${head}.${body}`)
          .digest('base64url');
        return `${head}.${body}.${sig}`;
      },
      /algorithm is not accepted/,
    ],
    [
      'from the issuer with a trailing slash (iss is compared exactly)',
      () => issuer.token({ subject: CHECKOUT, issuer: `${issuer.issuer}/` }),
      /"iss" claim/,
    ],
    [
      'for several audiences, none of them ours',
      () => issuer.token({ subject: CHECKOUT, audience: ['vault', 'token-broker-x'] }),
      /"aud" claim/,
    ],
    [
      'not valid yet (nbf an hour ahead)',
      () => issuer.token({ subject: CHECKOUT, notBeforeSeconds: 3600 }),
      /"nbf" claim/,
    ],
    ['garbage', async () => 'not.a.jwt', /not a well-formed/],
    ['one segment', async () => 'abcdef', /not a well-formed/],
  ];

  it.each(badTokens)('refuses a token %s with 401', async (_label, make, reason) => {
    const result = await outcome(authenticator().authenticate(`Bearer ${await make()}`));
    expect(result).toBeInstanceOf(CallerAuthException);
    const err = result as CallerAuthException;
    expect(err.code).toBe(CallerAuthErrorCode.Unauthenticated);
    expect(err.message).toMatch(reason);
  });

  it('accepts a token issued within the clock tolerance ahead of the broker (a fast cluster clock)', async () => {
    const token = await issuer.token({ subject: CHECKOUT, issuedAtSeconds: 3 });
    const caller = await outcome(authenticator().authenticate(`Bearer ${token}`));
    expect(caller).toMatchObject({ name: CHECKOUT });
  });

  it('accepts a token living exactly the 48 h maximum', async () => {
    const token = await issuer.token({ subject: CHECKOUT, expiresInSeconds: 48 * 3600 });
    const caller = await outcome(authenticator().authenticate(`Bearer ${token}`));
    expect(caller).toMatchObject({ name: CHECKOUT });
  });

  it('accepts a token whose audiences include ours (aud is an array)', async () => {
    const token = await issuer.token({ subject: CHECKOUT, audience: ['vault', 'token-broker'] });
    const caller = await outcome(authenticator().authenticate(`Bearer ${token}`));
    expect(caller).toMatchObject({ name: CHECKOUT });
  });

  it('refuses an oversized credential before hashing or parsing it, saying so (401)', () => {
    const auth = authenticator();
    const huge = `Bearer ${'a'.repeat(200_000)}`;
    let thrown: unknown;
    try {
      // Synchronous: no verification, no JWKS fetch was even started.
      void auth.authenticate(huge);
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(CallerAuthException);
    expect((thrown as CallerAuthException).code).toBe(CallerAuthErrorCode.Unauthenticated);
    expect((thrown as CallerAuthException).message).toMatch(/longer than 8208 characters/);
    expect(jwksRequests()).toBe(0);
  });

  it('turns a flood of tokens with random unknown kids into at most one JWKS fetch per cooldown', async () => {
    const auth = authenticator();
    await auth.authenticate(`Bearer ${await issuer.token({ subject: CHECKOUT })}`);
    const tokens = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        issuer.token({ subject: CHECKOUT, kid: `random-kid-${i}-${Math.random()}` }),
      ),
    );
    const outcomes = await Promise.all(
      tokens.map((t) => outcome(auth.authenticate(`Bearer ${t}`))),
    );
    for (const o of outcomes) {
      expect(o).toBeInstanceOf(CallerAuthException);
      expect((o as CallerAuthException).code).toBe(CallerAuthErrorCode.Unauthenticated);
    }
    // The warm-up fetch, and at most one refetch for the first unknown kid.
    expect(jwksRequests()).toBeLessThanOrEqual(2);
  });

  it('refetches the JWKS on an unknown kid (a key rotation), at most once per cooldown', async () => {
    const auth = authenticator();
    await auth.authenticate(`Bearer ${await issuer.token({ subject: CHECKOUT })}`);
    expect(jwksRequests()).toBe(1);
    await issuer.rotateKeys();
    // Within the cooldown, a token signed with the new key is refused without a refetch...
    const rotated = `Bearer ${await issuer.token({ subject: CHECKOUT })}`;
    const first = await outcome(auth.authenticate(rotated));
    expect(first).toBeInstanceOf(CallerAuthException);
    expect(jwksRequests()).toBe(1);
    // ...and a flood of unknown kids never turns into a flood of fetches.
    for (let i = 0; i < 20; i++) {
      await outcome(
        auth.authenticate(
          `Bearer ${await issuer.token({ subject: CHECKOUT, unpublishedKey: true })}`,
        ),
      );
    }
    expect(jwksRequests()).toBe(1);
  });

  it('picks up rotated keys on the first unknown kid once the cooldown allows', async () => {
    const keys = remoteServiceAccountKeys(issuer.jwksUrl, { cooldownMs: 0 });
    const auth = new KubernetesAuthenticator({
      issuer: issuer.issuer,
      audience: 'token-broker',
      subjects: { [CHECKOUT]: { clients: ['acme-prod'], scopes: ['token'] } },
      getKey: keys.getKey,
      cacheSize: 10,
      clockToleranceSeconds: 0,
      maxTokenLifetimeSeconds: 48 * 3600,
    });
    await auth.authenticate(`Bearer ${await issuer.token({ subject: CHECKOUT })}`);
    await issuer.rotateKeys();
    const caller = await auth.authenticate(`Bearer ${await issuer.token({ subject: CHECKOUT })}`);
    expect(caller.name).toBe(CHECKOUT);
    expect(jwksRequests()).toBe(2);
  });

  it('says "unavailable" (503), not 401, when the JWKS cannot be fetched, and backs off', async () => {
    issuer.failJwks(500);
    const auth = authenticator();
    const header = `Bearer ${await issuer.token({ subject: CHECKOUT })}`;
    for (let i = 0; i < 10; i++) {
      const result = await outcome(auth.authenticate(header));
      expect(result).toBeInstanceOf(CallerAuthException);
      expect((result as CallerAuthException).code).toBe(CallerAuthErrorCode.Unavailable);
    }
    expect(jwksRequests()).toBe(1);
    expect(fetchFailures).toHaveLength(1);
  });

  it('keeps accepting cached tokens while the JWKS is down', async () => {
    const auth = authenticator();
    const header = `Bearer ${await issuer.token({ subject: CHECKOUT })}`;
    const caller = await auth.authenticate(header);
    issuer.failJwks(503);
    expect(auth.authenticate(header)).toBe(caller);
  });

  describe('JWKS limits', () => {
    let server: Server;
    let jwksUrl: string;
    let answer: (res: ServerResponse) => void;

    beforeAll(async () => {
      server = createServer((_req, res) => answer(res));
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      jwksUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/openid/v1/jwks`;
    });

    afterAll(async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    });

    /** The outcome of a fresh token checked against the JWKS `answer` serves. */
    async function check(): Promise<Caller | CallerAuthException> {
      const header = `Bearer ${await issuer.token({ subject: CHECKOUT })}`;
      return outcome(authenticator({ jwksUrl }).authenticate(header));
    }

    it('stops reading a JWKS answer past 1 MiB (503; the logged failure says why)', async () => {
      // An endless answer without Content-Length, sent as fast as the broker reads it.
      let sent = 0;
      let closed = false;
      answer = (res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.on('close', () => (closed = true));
        const chunk = Buffer.alloc(64 * 1024, ' ');
        const pump = () => {
          while (!closed && sent < 256 * 1024 * 1024) {
            sent += chunk.length;
            if (!res.write(chunk)) return void res.once('drain', pump);
          }
        };
        res.write('{"keys": [');
        pump();
      };
      const result = await check();
      expect(result).toBeInstanceOf(CallerAuthException);
      expect((result as CallerAuthException).code).toBe(CallerAuthErrorCode.Unavailable);
      expect(fetchFailures).toHaveLength(1);
      expect(String(fetchFailures[0])).toMatch(
        /JWKS answer is refused: it is larger than 1048576 bytes/,
      );
      const deadline = Date.now() + 5000;
      while (!closed && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      expect(closed).toBe(true);
      // Socket buffers hold a few MiB at most: the rest was never sent.
      expect(sent).toBeLessThan(32 * 1024 * 1024);
    });

    it('refuses a JWKS listing more than 100 keys, and accepts 100', async () => {
      const real = issuer.publicJwks.find((k) => k.alg === 'ES256' || k.kty === 'EC')!;
      const keys = (n: number) => [
        real,
        ...Array.from({ length: n - 1 }, (_, i) => ({ ...real, kid: `decoy-${i}` })),
      ];
      answer = (res) => sendJwks(res, keys(101));
      const refused = await check();
      expect(refused).toBeInstanceOf(CallerAuthException);
      expect((refused as CallerAuthException).code).toBe(CallerAuthErrorCode.Unavailable);
      expect(String(fetchFailures[0])).toMatch(/it lists 101 keys, more than the 100 accepted/);

      answer = (res) => sendJwks(res, keys(100));
      expect(await check()).toMatchObject({ name: CHECKOUT });
    });

    function sendJwks(res: ServerResponse, keys: unknown[]): void {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ keys }));
    }
  });

  it('forgets a cached token when it expires', async () => {
    jest.useFakeTimers({ doNotFake: ['nextTick', 'setImmediate', 'queueMicrotask'] });
    try {
      const auth = authenticator();
      const header = `Bearer ${await issuer.token({ subject: CHECKOUT, expiresInSeconds: 30 })}`;
      await auth.authenticate(header);
      expect(auth.authenticate(header)).not.toBeInstanceOf(Promise);
      // Past the expiry and the 5 s clock tolerance.
      jest.setSystemTime(Date.now() + 40_000);
      const later = await outcome(auth.authenticate(header));
      expect(later).toBeInstanceOf(CallerAuthException);
      expect((later as CallerAuthException).message).toMatch(/expired/);
    } finally {
      jest.useRealTimers();
    }
  });
});
