import { createHash, generateKeyPairSync } from 'node:crypto';
import { clientSchema, type ClientConfig } from '../config/client.schema';
import type { SecretReader } from '../secrets/secret-reader';
import { DpopProofs, htuOf, nonceOf } from './dpop-proofs';
import { MemoryDpopStore } from './dpop-store';

const es256 = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });

function client(dpop: Record<string, unknown>): ClientConfig {
  return clientSchema.parse({
    id: 'bank',
    authUrl: 'https://as.bank.example',
    baseUrl: 'https://api.bank.example/v1',
    credentials: { file: '/run/creds.json' },
    tokenRequest: { grant: 'rfc6749', url: 'https://as.bank.example/token' },
    dpop,
  });
}

/** Files by name; no AWS. */
const files = (content: Record<string, string>): SecretReader => ({
  read: async (ref) => {
    const text = ref.file !== undefined ? content[ref.file] : undefined;
    if (text === undefined) throw new Error('no such file');
    return text;
  },
});

describe('DpopProofs', () => {
  it('signs an RFC 9449 proof: typ, the public jwk only, htm, htu without query, ath, iat, a fresh jti', async () => {
    const { jwtVerify, EmbeddedJWK, calculateJwkThumbprint } = await import('jose');
    const pem = es256.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const proofs = new DpopProofs(
      files({ '/k.pem': pem }),
      new MemoryDpopStore(),
      () => 1_700_000_000_000,
    );
    const c = client({ key: { file: '/k.pem' } });
    const sign = () =>
      proofs.proof(c, {
        method: 'POST',
        url: 'https://api.bank.example/v1/pay?x=1#f',
        accessToken: 'tok',
        server: 'rs',
      });
    const [one, two] = [await sign(), await sign()];
    const { payload, protectedHeader } = await jwtVerify(one, EmbeddedJWK, {
      typ: 'dpop+jwt',
      currentDate: new Date(1_700_000_000_000),
    });
    expect(protectedHeader.alg).toBe('ES256');
    expect(Object.keys(protectedHeader.jwk!).sort()).toEqual(['crv', 'kty', 'x', 'y']);
    expect(payload).toMatchObject({
      htm: 'POST',
      htu: 'https://api.bank.example/v1/pay',
      ath: createHash('sha256').update('tok').digest('base64url'),
      iat: 1_700_000_000,
    });
    expect(payload.nonce).toBeUndefined();
    expect((await jwtVerify(two, EmbeddedJWK)).payload.jti).not.toBe(payload.jti);
    await expect(proofs.thumbprint(c)).resolves.toBe(
      await calculateJwkThumbprint(protectedHeader.jwk!),
    );
  });

  it('carries the nonce a server gave, per server and origin, to every replica on the store', async () => {
    const { decodeJwt } = await import('jose');
    const store = new MemoryDpopStore();
    const jwk = JSON.stringify(es256.privateKey.export({ format: 'jwk' }));
    const reader = files({ '/k.json': jwk });
    const [a, b] = [new DpopProofs(reader, store), new DpopProofs(reader, store)];
    const c = client({ key: { file: '/k.json' } });
    await a.learn(c, 'as', 'https://as.bank.example/token', 'as-nonce');
    const nonceOfProof = async (p: DpopProofs, server: 'as' | 'rs', url: string) =>
      decodeJwt(await p.proof(c, { method: 'POST', url, server })).nonce;
    await expect(nonceOfProof(b, 'as', 'https://as.bank.example/token')).resolves.toBe('as-nonce');
    // Not the API's, even on the same origin; not another origin's.
    await expect(nonceOfProof(b, 'rs', 'https://as.bank.example/x')).resolves.toBeUndefined();
    await expect(nonceOfProof(b, 'as', 'https://other.example/token')).resolves.toBeUndefined();
  });

  it('generates one key for every replica sharing the store', async () => {
    const store = new MemoryDpopStore();
    const c = client({});
    const [a, b] = [new DpopProofs(files({}), store), new DpopProofs(files({}), store)];
    await expect(a.thumbprint(c)).resolves.toBe(await b.thumbprint(c));
  });

  it('names the client and the setting when the key does not fit the alg or is no key, and tries again later', async () => {
    const content: Record<string, string> = {
      '/rsa.pem': rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string,
      '/junk': 'not a key',
    };
    const proofs = new DpopProofs(files(content), new MemoryDpopStore());
    const misfit = client({ key: { file: '/rsa.pem' } });
    await expect(proofs.thumbprint(misfit)).rejects.toThrow(
      'client "bank": dpop.key.file ("/rsa.pem"): ES256 needs an EC P-256 key (dpop.alg is "ES256"); set dpop.alg to fit the key',
    );
    await expect(proofs.thumbprint(client({ key: { file: '/junk' } }))).rejects.toThrow(
      'client "bank": dpop.key.file ("/junk") holds neither a private JWK nor a PEM private key',
    );
    content['/rsa.pem'] = es256.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    await expect(proofs.thumbprint(misfit)).resolves.toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  it('tells a key an operator must fix from one a later read may get', async () => {
    const unavailable = Object.assign(new Error('Secrets Manager did not answer'), {
      transient: true,
    });
    const missing = Object.assign(new Error('no such secret'), { transient: false });
    let next: Error = unavailable;
    const reader: SecretReader = {
      read: async () => {
        throw next;
      },
    };
    const proofs = new DpopProofs(reader, new MemoryDpopStore());
    const c = client({ key: { secretId: 'bank/dpop' } });
    await expect(proofs.thumbprint(c)).rejects.toMatchObject({
      permanent: false,
      message: expect.stringContaining('client "bank": dpop.key.secretId') as string,
    });
    next = missing;
    await expect(proofs.thumbprint(c)).rejects.toMatchObject({ permanent: true });
    const junk = new DpopProofs(files({ '/j': 'junk' }), new MemoryDpopStore());
    await expect(junk.thumbprint(client({ key: { file: '/j' } }))).rejects.toMatchObject({
      permanent: true,
    });
  });

  it('signs with each configured alg', async () => {
    const { decodeProtectedHeader } = await import('jose');
    for (const [alg, key] of [
      ['PS256', rsa.privateKey],
      ['RS256', rsa.privateKey],
      ['EdDSA', generateKeyPairSync('ed25519').privateKey],
    ] as const) {
      const proofs = new DpopProofs(
        files({ '/k': key.export({ type: 'pkcs8', format: 'pem' }) as string }),
        new MemoryDpopStore(),
      );
      const proof = await proofs.proof(client({ key: { file: '/k' }, alg }), {
        method: 'GET',
        url: 'https://api.bank.example/v1/a',
        server: 'rs',
      });
      expect(decodeProtectedHeader(proof).alg).toBe(alg);
    }
  });

  it('reads a DPoP-Nonce only as RFC 9449 allows it, and htu without query or fragment', () => {
    expect(nonceOf('abc-123_~')).toBe('abc-123_~');
    expect(nonceOf(['first', 'second'])).toBe('first');
    expect(nonceOf('has space')).toBeUndefined();
    expect(nonceOf('"quoted"')).toBeUndefined();
    expect(nonceOf(undefined)).toBeUndefined();
    expect(htuOf('https://a.example:8443/p/q?x=1#y')).toBe('https://a.example:8443/p/q');
  });
});

describe('client schema: dpop', () => {
  const parse = (dpop: unknown, grant = 'rfc6749') =>
    clientSchema.safeParse({
      id: 'bank',
      authUrl: 'https://as.bank.example',
      baseUrl: 'https://api.bank.example',
      credentials: { file: '/c.json' },
      tokenRequest: { grant, ...(grant === 'rfc6749' && { url: 'https://as.bank.example/token' }) },
      dpop,
    });
  const messages = (r: ReturnType<typeof parse>) =>
    r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);

  it('defaults to a generated ES256 key, no hand-out', () => {
    const r = parse({});
    expect(r.success && r.data.dpop).toEqual({
      key: { generate: true },
      alg: 'ES256',
      handOut: false,
    });
  });

  it('refuses two key sources, none, generate false, and the provider dialect', () => {
    expect(messages(parse({ key: { file: '/k', generate: true } }))).toEqual([
      'dpop.key: set exactly one of secretId, file or generate',
    ]);
    expect(messages(parse({ key: {} }))).toEqual([
      'dpop.key: set exactly one of secretId, file or generate',
    ]);
    expect(messages(parse({ key: { generate: false, file: '/k' } }))).toEqual([
      'dpop.key.generate: set it to true, or leave it out',
    ]);
    expect(messages(parse({}, 'provider-query'))).toEqual([
      'dpop: only with tokenRequest.grant "rfc6749": the provider\'s dialect ("provider-query") knows no DPoP',
    ]);
  });
});
