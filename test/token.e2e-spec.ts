import type { ProviderEmulator } from '../emulator/provider-emulator';
import type { SecretsManagerEmulator } from '../emulator/secrets-manager-emulator';
import { type AddBrokerOptions, type Stack, type StackBroker, startStack } from './support/stack';
import { waitFor } from './support/wait';

const CLIENT = 'acme-preprod';
/** Where the stack's Secrets Manager keeps the client's credentials. */
const SECRET_ID = `token-broker/${CLIENT}`;
const CREDS = { client_id: 'acme-merchant', client_secret: 'acme-very-secret' };

interface TokenBody {
  access_token: string;
  token_type: string;
  expires_in: number;
  expires_at: string;
}

/**
 * One broker in the Jest process per test, credentials from the real AWS SDK against a local
 * Secrets Manager. The last test is about the process (its exit code): a child process there.
 */
describe('GET /token (single broker, Secrets Manager credentials)', () => {
  let set: Stack;
  let provider: ProviderEmulator;
  let secrets: SecretsManagerEmulator;

  /** A broker on this test's stack; readiness awaited unless `add.wait` says otherwise. */
  const broker = (
    env: Record<string, string | undefined> = {},
    add: AddBrokerOptions = {},
  ): Promise<StackBroker> => set.addBroker({ ...add, env });

  /** Until the broker's readiness answers 200. */
  const waitReady = (b: StackBroker) =>
    waitFor(
      async () =>
        (await fetch(`${b.url}/health/ready`).catch(() => ({ status: 0 }))).status === 200 ||
        undefined,
      { timeoutMs: 10_000, what: `${b.name} to be ready` },
    );

  beforeEach(async () => {
    set = await startStack({
      name: 'token',
      inProcess: true,
      replicas: 0,
      clients: [{ id: CLIENT, credentials: CREDS }],
      secrets: 'secrets-manager',
      knobs: { tokenLifetimeSeconds: 60 },
      env: { LOG_LEVEL: 'warn', TOKEN_BACKOFF_BASE_MS: '50', TOKEN_BACKOFF_MAX_MS: '500' },
    });
    provider = set.provider;
    secrets = set.secrets!;
  });

  afterEach(async () => {
    await set?.close();
  });

  it('serves an RFC 6749-shaped token with no-store, and one provider request for many calls', async () => {
    const b = await broker();
    const first = await fetch(`${b.url}/token`);
    expect(first.status).toBe(200);
    expect(first.headers.get('cache-control')).toBe('no-store');
    expect(first.headers.get('content-type')).toMatch(/^application\/json/);
    const body = (await first.json()) as TokenBody;
    expect(Object.keys(body).sort()).toEqual([
      'access_token',
      'expires_at',
      'expires_in',
      'token_type',
    ]);
    expect(body.token_type).toBe('Bearer');
    expect(provider.isValidToken(body.access_token)).toBe(true);
    expect(body.expires_in).toBeGreaterThan(55);
    expect(body.expires_in).toBeLessThanOrEqual(60);
    expect(
      Math.abs(Date.parse(body.expires_at) - Date.now() - body.expires_in * 1000),
    ).toBeLessThan(2000);

    const again = await Promise.all(
      Array.from({ length: 50 }, () =>
        fetch(`${b.url}/token?client=acme-preprod`).then((r) => r.json()),
      ),
    );
    expect(new Set((again as TokenBody[]).map((r) => r.access_token))).toEqual(
      new Set([body.access_token]),
    );
    expect(provider.stats.tokenRequests).toBe(1);
    expect(secrets.stats.requests).toBe(1);

    const metrics = await (await fetch(`${b.url}/metrics`)).text();
    const hits = /token_broker_cache_lookups_total\{layer="l1",outcome="hit"\} (\d+)/.exec(metrics);
    expect(Number(hits?.[1])).toBeGreaterThanOrEqual(50);
    expect(metrics).toMatch(/token_broker_refresh_total\{result="fetched"\} 1\n/);
    expect(metrics).not.toContain(body.access_token);
  });

  it('echoes a sane X-Request-Id on a cache hit and replaces an unsafe one', async () => {
    const b = await broker();
    const kept = await fetch(`${b.url}/token`, { headers: { 'x-request-id': 'caller-req-7' } });
    expect(kept.status).toBe(200);
    expect(kept.headers.get('x-request-id')).toBe('caller-req-7');
    const replaced = await fetch(`${b.url}/token`, { headers: { 'x-request-id': 'a b<script>' } });
    expect(replaced.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/);
    expect(replaced.headers.get('x-content-type-options')).toBe('nosniff');
  });

  it('refreshes when a caller needs more lifetime than the token has left (mandatory window)', async () => {
    const b = await broker();
    const first = (await (await fetch(`${b.url}/token`)).json()) as TokenBody;
    await waitFor(() => Date.now() > Date.parse(first.expires_at) - 58_500, {
      timeoutMs: 3000,
      what: 'time to pass',
    });
    const res = await fetch(`${b.url}/token?min_ttl=59`);
    expect(res.status).toBe(200);
    const second = (await res.json()) as TokenBody;
    expect(second.access_token).not.toBe(first.access_token);
    expect(second.expires_in).toBeGreaterThanOrEqual(59);
    expect(provider.stats.tokenRequests).toBe(2);
  });

  it.each([
    ['/token?client=nobody', 404, 'unknown_client'],
    ['/token?client=a&client=b', 400, 'invalid_request'],
    ['/token?min_ttl=abc', 400, 'invalid_request'],
    ['/token?min_ttl=-5', 400, 'invalid_request'],
    ['/token?min_ttl=999999999', 400, 'invalid_request'],
    ['/nothing-here', 404, 'not_found'],
  ])('answers %s with %i problem+json %s', async (path, status, code) => {
    const b = await broker();
    const res = await fetch(`${b.url}${path}`);
    expect(res.status).toBe(status);
    expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    const problem = (await res.json()) as { code: string; status: number; detail: string };
    expect(problem.code).toBe(code);
    expect(problem.status).toBe(status);
    expect(problem.detail.length).toBeGreaterThan(10);
  });

  it('answers 503 with Retry-After while the provider is down at start, then recovers', async () => {
    provider.setKnobs({ tokenFailure: { kind: 'status', status: 503 } });
    const b = await broker({ TOKEN_WAIT_TIMEOUT_MS: '300' }, { wait: 'none' });
    await waitFor(() => provider.stats.tokenRequests >= 2, { timeoutMs: 10_000, what: 'retries' });
    const ready = await fetch(`${b.url}/health/ready`);
    expect(ready.status).toBe(503);
    const res = await fetch(`${b.url}/token`);
    expect(res.status).toBe(503);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(((await res.json()) as { code: string }).code).toBe('token_unavailable');

    provider.setKnobs({ tokenFailure: null });
    await waitReady(b);
    expect((await fetch(`${b.url}/token`)).status).toBe(200);
  });

  it('tells operators which secret to check when the credentials cannot be read, callers its code only', async () => {
    secrets.deleteSecret(SECRET_ID);
    const b = await broker({}, { wait: 'none' });
    await waitFor(() => secrets.stats.requests >= 1, {
      timeoutMs: 10_000,
      what: 'a Secrets Manager read',
    });
    const res = await waitFor(
      async () => {
        const r = await fetch(`${b.url}/token`);
        return r.status === 503 ? r : null;
      },
      { timeoutMs: 10_000, what: 'a 503' },
    );
    // The caller gets the code and the request id; the secret's name is for operators (logs,
    // the admin port): an ARN names the AWS account.
    const text = await res.text();
    const problem = JSON.parse(text) as { code: string; detail: string; requestId: string };
    expect(problem.code).toBe('credentials_unavailable');
    expect(problem.requestId).toEqual(expect.any(String));
    expect(text).not.toContain(SECRET_ID);
    const readyText = await (await fetch(`${b.url}/health/ready`)).text();
    expect(JSON.parse(readyText)).toEqual({ status: 'error' });
    expect(readyText).not.toContain(SECRET_ID);
    await waitFor(() => b.logs().some((l) => l.includes(SECRET_ID)), {
      timeoutMs: 5000,
      what: 'a log line naming the secret',
    });
    expect(b.logs().join('\n')).not.toContain(CREDS.client_secret);
  });

  it('re-reads rotated credentials when the provider refuses the old ones', async () => {
    provider.setKnobs({ tokenLifetimeSeconds: 4 });
    // 4 s tokens: the refresh floor must stay below 3 s for them to be servable.
    const b = await broker({
      TOKEN_REFRESH_AHEAD_SECONDS: '2',
      TOKEN_MIN_REFRESH_INTERVAL_MS: '1000',
    });
    const first = (await (await fetch(`${b.url}/token`)).json()) as TokenBody;
    const rotated = { client_id: CREDS.client_id, client_secret: 'rotated-secret-2' };
    secrets.setSecret(SECRET_ID, JSON.stringify(rotated));
    provider.setCredentials({ [rotated.client_id]: rotated.client_secret });
    // The scheduled refresh meets invalid_client, re-reads the secret and succeeds, no restart.
    const body = await waitFor(
      async () => {
        const t = (await (await fetch(`${b.url}/token`)).json()) as TokenBody;
        return t.access_token !== first.access_token ? t : null;
      },
      { timeoutMs: 10_000, what: 'a token obtained with the rotated secret' },
    );
    expect(provider.isValidToken(body.access_token)).toBe(true);
    expect(provider.stats.rejectedTokenAuth).toBe(1);
    expect(secrets.stats.requests).toBe(2);
    expect(b.logs().join('\n')).not.toContain(rotated.client_secret);
  });

  it('refuses to start on a bad setting, naming it and not its value', async () => {
    // Exit code 78 is main.ts's: a child process, its client set by variables, not the file.
    const b = await broker(
      {
        BROKER_CONFIG_FILE: undefined,
        CLIENT_ID: CLIENT,
        PROVIDER_BASE_URL: provider.url,
        CREDENTIALS_SECRET_ID: SECRET_ID,
        PORT: 'not-a-port-SECRETISH',
        PROVIDER_AUTH_URL: 'nope',
      },
      { inProcess: false, wait: 'none' },
    );
    const exit = await b.process!.exited;
    expect(exit.code).toBe(78);
    const out = b.logs().join('\n');
    expect(out).toContain('PORT');
    expect(out).toContain('PROVIDER_AUTH_URL');
    expect(out).not.toContain('SECRETISH');
  });
});
