import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { CALLER_CLIENTS, fingerprint, UNAVAILABLE_CLIENT } from './support/caller-brokers';
import { type Stack, startStack } from './support/stack';
import { waitFor } from './support/wait';

const run = promisify(execFile);

/** The part of simple-oauth2 5's API used here (it ships no types; @types is not installed). */
interface SimpleOAuth2AccessToken {
  token: { access_token: string; expires_in: number; expires_at: Date };
  expired(expirationWindowSeconds?: number): boolean;
}
interface SimpleOAuth2 {
  ClientCredentials: new (options: {
    client: { id: string; secret: string };
    auth: { tokenHost: string; tokenPath: string };
    options: { authorizationMethod: 'header' | 'body' };
  }) => { getToken(params: Record<string, string>): Promise<SimpleOAuth2AccessToken> };
}
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { ClientCredentials } = require('simple-oauth2') as SimpleOAuth2;
const ROOT = join(__dirname, '..');
/** Short provider tokens: the broker refreshes at half-life (3 s), callers re-ask near expiry. */
const LIFETIME_S = 6;
/** How early the callers' own expiry check re-asks (the libraries' "expiration window"). */
const MARGIN_S = 1;
/** How long each library is driven, calling for a token every {@link TICK_MS}. */
const DRIVE_MS = 13_000;
const TICK_MS = 100;

/** One token request the library made, as seen by the code using it. */
interface Fetch {
  at: number;
  token: string;
  expiresIn: number;
}

interface Drive {
  /** Times the application asked for a token (cache hits included). */
  calls: number;
  fetches: Fetch[];
}

/**
 * `openid-client` 6 is ES modules only, which Jest's CommonJS runtime loads only with VM
 * modules (`npm test`), so it runs unmodified in a child `node` process, as an application
 * runs it: discovery through RFC 8414 metadata, `client_secret_basic`, and its `expiresIn()`
 * deciding when to ask again (openid-client keeps no cache of its own: the
 * application keeps the token and asks `expiresIn()`, as its documentation shows).
 */
const OPENID_CLIENT_DRIVER = `
import * as client from 'openid-client';
const [url, id, secret, resource, driveMs, tickMs, margin] = process.argv.slice(1);
const config = await client.discovery(new URL(url), id, undefined, client.ClientSecretBasic(secret), {
  algorithm: 'oauth2',
  execute: [client.allowInsecureRequests],
});
const fetches = [];
let tokens;
let calls = 0;
const end = Date.now() + Number(driveMs);
while (Date.now() < end) {
  calls++;
  if (!tokens || tokens.expiresIn() <= Number(margin)) {
    tokens = await client.clientCredentialsGrant(config, { resource });
    fetches.push({ at: Date.now(), token: tokens.access_token, expiresIn: tokens.expiresIn() });
  }
  await new Promise((r) => setTimeout(r, Number(tickMs)));
}
process.stdout.write(JSON.stringify({ calls, fetches, tokenEndpoint: config.serverMetadata().token_endpoint }));
`;

/**
 * Stock OAuth 2.0 client-credentials libraries, unmodified, against the broker (in the Jest
 * process, over HTTP):
 * the only setting that names the broker is the token URL (or the issuer for discovery).
 * Each library's own expiry handling is driven for two provider token lifetimes: it answers
 * from its cache until its expiration window, then re-asks and gets the fleet's next token.
 */
jest.setTimeout(90_000);

describe('stock OAuth clients against the broker', () => {
  let set: Stack;

  beforeAll(async () => {
    set = await startStack({
      name: 'stock',
      inProcess: true,
      clients: [...CALLER_CLIENTS, { id: UNAVAILABLE_CLIENT, refused: true }],
      secrets: 'secrets-manager',
      callerAuth: {
        mode: 'api-key',
        callers: {
          checkout: { clients: ['acme-prod'] },
          oidc: { clients: ['acme-prod'] },
          simple: { clients: ['acme-prod'] },
        },
      },
      knobs: { tokenLifetimeSeconds: LIFETIME_S },
      // One audit line per token request (the setting that keeps them), so each answer's
      // token can be matched with its line in order.
      env: { AUDIT_PER_REQUEST: 'true' },
    });
  });

  afterAll(async () => {
    await set?.close();
  });

  /** The broker's audit lines for `caller`: one per token request it answered. */
  async function auditedRequests(caller: string, atLeast: number): Promise<string[]> {
    return waitFor(
      () => {
        const fps = set.broker
          .logs()
          .filter((l) => l.includes('"audit":"token"'))
          .map((l) => JSON.parse(l) as { caller: string; fp: string })
          .filter((l) => l.caller === caller)
          .map((l) => l.fp);
        return fps.length >= atLeast ? fps : undefined;
      },
      { timeoutMs: 5000, what: `${atLeast} audit lines of caller ${caller}` },
    );
  }

  /** Tokens the provider issued to acme's credentials, oldest first. */
  const acmeIssued = () => set.provider.stats.issued.filter((t) => t.clientId === 'acme-merchant');
  const issueIndex = (token: string) => acmeIssued().findIndex((t) => t.token === token);
  /** When the provider says `token` expires (epoch ms): the ground truth. */
  const providerExpiry = (token: string) => acmeIssued().find((t) => t.token === token)!.expiresAt;

  /**
   * What "the library's cache and expiry handling behave" means, checked on what it did:
   * every fetched token valid, each re-ask between its expiration window and the token's
   * expiry (not earlier: answered from cache; not later: never used an expired token), and
   * each re-ask answered with the fleet's current token, newer than the one it had.
   */
  function expectCacheBehaviour(drive: Drive): void {
    const { fetches } = drive;
    // 13 s of 6 s tokens served from ~3 s into their life: at least three fetches.
    expect(fetches.length).toBeGreaterThanOrEqual(3);
    expect(fetches.length).toBeLessThanOrEqual(6);
    expect(drive.calls).toBeGreaterThan(fetches.length * 10);
    for (const f of fetches) {
      expect(f.expiresIn).toBeGreaterThan(MARGIN_S);
      expect(f.expiresIn).toBeLessThanOrEqual(LIFETIME_S);
      expect(issueIndex(f.token)).toBeGreaterThanOrEqual(0);
    }
    for (let i = 1; i < fetches.length; i++) {
      const prev = fetches[i - 1];
      const next = fetches[i];
      const prevExpiry = providerExpiry(prev.token);
      // Cached until the window: not re-asked earlier than the window, two rounding seconds
      // (the broker's `expires_in` and openid-client's `expiresIn()` are whole seconds, both
      // rounded down) and a tick.
      expect(next.at).toBeGreaterThanOrEqual(prevExpiry - (MARGIN_S + 2) * 1000 - TICK_MS);
      // Re-asked before the token it held expired.
      expect(next.at).toBeLessThan(prevExpiry);
      expect(fingerprint(next.token)).not.toBe(fingerprint(prev.token));
      // The fleet's token of the moment: newer than the one held, and none newer issued more
      // than a moment before it was answered (the broker refreshes at 2.25-3 s of a 6 s life,
      // so it can be one or two generations on).
      expect(issueIndex(next.token)).toBeGreaterThan(issueIndex(prev.token));
      const newestBefore = acmeIssued().filter((t) => t.issuedAt <= next.at - 50).length - 1;
      expect(issueIndex(next.token)).toBeGreaterThanOrEqual(newestBefore);
    }
  }

  it('openid-client 6.9.0: discovery, client_secret_basic, re-asks near expiry for the next token', async () => {
    const { stdout } = await run(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        OPENID_CLIENT_DRIVER,
        set.broker.url,
        'oidc',
        set.keys.oidc,
        'acme-prod',
        String(DRIVE_MS),
        String(TICK_MS),
        String(MARGIN_S),
      ],
      { cwd: ROOT, timeout: DRIVE_MS + 20_000 },
    );
    const drive = JSON.parse(stdout) as Drive & { tokenEndpoint: string };
    expect(drive.tokenEndpoint).toBe(`${set.broker.url}/oauth2/token`);
    expectCacheBehaviour(drive);
    // The broker answered exactly the requests the library says it made: no hidden retries.
    const audited = await auditedRequests('oidc', drive.fetches.length);
    expect(audited).toEqual(drive.fetches.map((f) => fingerprint(f.token)));
  });

  it('simple-oauth2 5.1.0: form credentials, its expired(window) re-asks for the next token', async () => {
    const oauth = new ClientCredentials({
      client: { id: 'simple', secret: set.keys.simple },
      auth: { tokenHost: set.broker.url, tokenPath: '/oauth2/token' },
      options: { authorizationMethod: 'body' },
    });
    const fetches: Fetch[] = [];
    let calls = 0;
    let held: SimpleOAuth2AccessToken | undefined;
    const end = Date.now() + DRIVE_MS;
    while (Date.now() < end) {
      calls++;
      if (!held || held.expired(MARGIN_S)) {
        held = await oauth.getToken({ resource: 'acme-prod' });
        fetches.push({
          at: Date.now(),
          token: held.token.access_token,
          expiresIn: held.token.expires_in,
        });
      }
      // The token in hand is always one the provider accepts.
      expect(set.provider.isValidToken(held.token.access_token)).toBe(true);
      await new Promise((r) => setTimeout(r, TICK_MS));
    }
    expectCacheBehaviour({ calls, fetches });
    const audited = await auditedRequests('simple', fetches.length);
    expect(audited).toEqual(fetches.map((f) => fingerprint(f.token)));
  });

  it('curl, exactly as the README shows', async () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const block = /```sh\n(curl [^`]*?http:\/\/token-broker\/oauth2\/token)\n```/.exec(readme);
    expect(block).not.toBeNull();
    const command = block![1].replaceAll('http://token-broker', set.broker.url);
    const { stdout } = await run('sh', ['-c', command], {
      env: { PATH: process.env.PATH, CALLER_KEY: set.keys.checkout },
    });
    const body = JSON.parse(stdout) as { access_token: string; token_type: string };
    expect(body.token_type).toBe('Bearer');
    expect(set.provider.isValidToken(body.access_token)).toBe(true);
  });
});
