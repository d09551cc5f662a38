import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import type { ProviderEmulator, TokenFailure } from '../../emulator/provider-emulator';
import { redisKeys } from '../../src/redis/redis.constants';
import { AesGcmTokenCipher } from '../../src/token/aes-gcm-token.cipher';
import { fingerprintOf } from '../../src/token/token-record';
import type { BrokerProcess } from '../support/broker-process';
import { type Stack, startStack } from '../support/stack';
import type { TokenBody } from '../support/token-watch';
import { delay, waitFor } from '../support/wait';

/**
 * Every bad input gets a clear answer and nothing else happens: a problem+json (or, for
 * configuration, exit code 78 and a message naming the setting), no crash (the broker keeps
 * serving), and no secret or token in any response body or log line.
 */

/** Planted in bad values: it must never come back in an answer or a log line. */
const CANARY = 'Zq9CANARYvalue';
const CLIENT = 'bad-input';
const REDIS_CLIENT = 'bad-redis';
const CREDS = { client_id: 'bad-input-merchant', client_secret: 'bad-input-client-secret-007' };
const PROVIDER_LIFETIME_S = 60;
/** The broker that meets bad Redis values refreshes often, so each case is seen quickly. */
const REDIS_LIFETIME_S = 3;

interface Answer {
  status: number;
  contentType: string;
  body: string;
  retryAfter?: string;
}

interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
}

/** One HTTP exchange with full control of the request line (node:http, no keep-alive). */
function send(baseUrl: string, method: string, path: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${baseUrl}${path}`, { method, agent: false, timeout: 5000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.once('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          contentType: String(res.headers['content-type'] ?? ''),
          body,
          retryAfter: res.headers['retry-after'],
        }),
      );
    });
    req.once('timeout', () => req.destroy(new Error('timed out')));
    req.once('error', reject);
    req.end();
  });
}

function problemOf(answer: Answer): Problem {
  expect(answer.contentType).toMatch(/^application\/problem\+json/);
  const problem = JSON.parse(answer.body) as Problem;
  expect(problem).toMatchObject({
    status: answer.status,
    type: `urn:token-broker:problem:${problem.code}`,
  });
  expect(problem.title.length).toBeGreaterThan(0);
  expect(problem.detail.length).toBeGreaterThan(0);
  return problem;
}

describe('bad input', () => {
  /** The broker of bad requests and provider answers; its Redis is shared with {@link redisStack}. */
  let stack: Stack;
  /** The broker that meets bad Redis values, on its own provider of short-lived tokens. */
  let redisStack: Stack;
  let raw: Redis;
  let provider: ProviderEmulator;
  let redisProvider: ProviderEmulator;
  let broker: BrokerProcess;
  let redisBroker: BrokerProcess;
  const cacheKey = randomBytes(32);
  const spawned: BrokerProcess[] = [];
  /** Every response body the suite received, for the final leak check. */
  const answers: string[] = [];
  const baseEnv: Record<string, string> = {
    TOKEN_WAIT_TIMEOUT_MS: '800',
    TOKEN_BACKOFF_BASE_MS: '50',
    TOKEN_BACKOFF_MAX_MS: '200',
    PROVIDER_RESPONSE_TIMEOUT_MS: '1000',
    // A floor shorter than the default 5 s: 'provider token responses' forces a refresh with
    // min_ttl=lifetime-1 1.5 s after the last grant, and 'bad-redis' serves 3 s tokens.
    TOKEN_MIN_REFRESH_INTERVAL_MS: '1000',
  };

  async function call(method: string, path: string, target = broker): Promise<Answer> {
    const answer = await send(target.url, method, path);
    if (answer.status !== 200) answers.push(answer.body);
    return answer;
  }

  /** The broker is alive and still hands out a valid token. */
  async function stillServing(target: BrokerProcess, emulator: ProviderEmulator): Promise<void> {
    expect(target.isRunning()).toBe(true);
    expect((await send(target.url, 'GET', '/health/live')).status).toBe(200);
    const res = await send(target.url, 'GET', '/token');
    expect(res.status).toBe(200);
    expect(emulator.isValidToken((JSON.parse(res.body) as TokenBody).access_token)).toBe(true);
  }

  beforeAll(async () => {
    // Processes: "no crash" and how each ends (exit 0, or 78 on bad configuration) are the
    // subject. The first stack starts the Redis both brokers share, then both brokers at once.
    stack = await startStack({
      name: 'bad-input',
      clients: [{ id: CLIENT, credentials: CREDS }],
      redis: 'standalone',
      cacheKey: cacheKey.toString('base64'),
      replicas: 0,
      env: baseEnv,
      knobs: { tokenLifetimeSeconds: PROVIDER_LIFETIME_S },
    });
    provider = stack.provider;
    raw = new Redis(stack.redis!.url!, { maxRetriesPerRequest: 1 });
    const [first] = await Promise.all([
      stack.addBroker({ name: 'bad-input' }),
      startStack({
        name: 'bad-redis',
        clients: [{ id: REDIS_CLIENT, credentials: CREDS }],
        redis: stack.redis,
        cacheKey: cacheKey.toString('base64'),
        env: {
          ...baseEnv,
          TOKEN_REFRESH_AHEAD_SECONDS: '1',
          TOKEN_DEFAULT_LIFETIME_SECONDS: String(REDIS_LIFETIME_S),
          REDIS_PING_INTERVAL_MS: '200',
          REDIS_COMMAND_TIMEOUT_MS: '300',
          TOKEN_LOCK_TTL_MS: '1000',
        },
        knobs: { tokenLifetimeSeconds: REDIS_LIFETIME_S },
      }).then((started) => (redisStack = started)),
    ]);
    redisProvider = redisStack.provider;
    broker = first.process!;
    redisBroker = redisStack.broker.process!;
    spawned.push(broker, redisBroker);
  }, 40_000);

  afterAll(async () => {
    raw?.disconnect();
    // The one Redis is the first stack's: it goes last.
    await redisStack?.close();
    await stack?.close();
  }, 30_000);

  describe('requests', () => {
    const requestCases: Array<[string, string, string, number, RegExp]> = [
      ['min_ttl not a number', 'GET', '/token?min_ttl=abc', 400, /min_ttl/],
      ['min_ttl negative', 'GET', '/token?min_ttl=-1', 400, /min_ttl/],
      ['min_ttl fractional', 'GET', '/token?min_ttl=1.5', 400, /min_ttl/],
      ['min_ttl in exponent notation', 'GET', '/token?min_ttl=1e3', 400, /min_ttl/],
      ['min_ttl beyond any lifetime', 'GET', '/token?min_ttl=86401', 400, /min_ttl/],
      ['min_ttl astronomically large', 'GET', `/token?min_ttl=${'9'.repeat(40)}`, 400, /min_ttl/],
      ['min_ttl repeated', 'GET', '/token?min_ttl=1&min_ttl=2', 400, /repeated/],
      ['unknown client', 'GET', '/token?client=nobody', 404, /no client/],
      ['client repeated', 'GET', `/token?client=${CLIENT}&client=${CLIENT}`, 400, /repeated/],
      ['client with bad percent-encoding', 'GET', '/token?client=%ZZ', 404, /no client/],
      ['client with control characters', 'GET', '/token?client=%00%0d%0a', 404, /no client/],
      [
        'client far too long to be an id',
        'GET',
        `/token?client=${CANARY}${'x'.repeat(3000)}`,
        404,
        /no client/,
      ],
      ['oversized query string', 'GET', `/token?pad=${'a'.repeat(20_000)}`, 400, /shorten/],
      ['unknown path', 'GET', '/tokens', 404, /route/],
      ['unknown method on /token', 'POST', '/token', 404, /route/],
      ['DELETE on /token', 'DELETE', '/token', 404, /route/],
    ];

    it.each(requestCases)(
      '%s: a clear problem+json, and the broker keeps serving',
      async (_name, method, path, status, detail) => {
        const answer = await call(method, path);
        expect(answer.status).toBe(status);
        const problem = problemOf(answer);
        expect(problem.detail).toMatch(detail);
        // Caller input is not echoed at length (the oversized values above never come back).
        expect(answer.body.length).toBeLessThan(1024);
        expect(answer.body).not.toContain(CANARY);
        await stillServing(broker, provider);
      },
    );

    it('min_ttl longer than the provider grants: 503 at once, without asking the provider', async () => {
      const before = provider.stats.tokenRequests;
      // Within TOKEN_REFRESH_AHEAD_SECONDS (300), beyond the 60 s the provider grants.
      const tooLong = PROVIDER_LIFETIME_S * 2;
      const refused = await Promise.all(
        Array.from({ length: 5 }, () => call('GET', `/token?min_ttl=${tooLong}`)),
      );
      for (const answer of refused) {
        expect(answer.status).toBe(503);
        expect(problemOf(answer).detail).toMatch(
          /tokens live 60 s, less than the requested min_ttl/,
        );
      }
      // A second wave: still no provider request per caller.
      await call('GET', `/token?min_ttl=${tooLong}`);
      expect(provider.stats.tokenRequests - before).toBeLessThanOrEqual(1);
      await stillServing(broker, provider);
    });
  });

  describe('provider token responses', () => {
    const huge = JSON.stringify({ access_token: CANARY, padding: 'p'.repeat(200_000) });
    const garbage = (
      body: string,
      contentType = 'application/json',
      status?: number,
    ): TokenFailure => ({
      kind: 'garbage',
      body,
      contentType,
      status,
    });
    const providerCases: Array<[string, TokenFailure, number, RegExp]> = [
      [
        'missing access_token',
        garbage('{"token_type":"Bearer","expires_in":60}'),
        503,
        /"access_token" is missing/,
      ],
      [
        'empty access_token',
        garbage('{"access_token":"","expires_in":60}'),
        503,
        /"access_token" is missing/,
      ],
      [
        'access_token not a string',
        garbage('{"access_token":12345,"expires_in":60}'),
        503,
        /"access_token" is missing/,
      ],
      [
        'access_token with characters a bearer token cannot have',
        garbage(`{"access_token":"${CANARY} \\"x\\""}`),
        503,
        /characters not allowed/,
      ],
      ['non-JSON body', garbage(`not json at all ${CANARY}`, 'text/plain'), 503, /not valid JSON/],
      [
        'HTML error page with 200',
        garbage(`<html><body>Sign in ${CANARY}</body></html>`, 'text/html'),
        503,
        /HTML/,
      ],
      [
        'HTML error page with 502',
        garbage(`<html><body>Bad gateway ${CANARY}</body></html>`, 'text/html', 502),
        503,
        /HTTP 502/,
      ],
      ['huge body', garbage(huge), 503, /exceeds \d+ bytes/],
      ['empty body', garbage('', 'application/json'), 503, /empty/],
      ['JSON array instead of an object', garbage(`["${CANARY}"]`), 503, /not a JSON object/],
      [
        'token_type other than Bearer',
        garbage(`{"access_token":"${CANARY}","token_type":"mac"}`),
        503,
        /neither "Bearer" nor "DPoP"/,
      ],
      [
        'expires_in zero',
        garbage(`{"access_token":"${CANARY}","expires_in":0}`),
        503,
        /zero or negative/,
      ],
      [
        'expires_in negative',
        garbage(`{"access_token":"${CANARY}","expires_in":-60}`),
        503,
        /zero or negative/,
      ],
      [
        'expires_in not numeric',
        garbage(`{"access_token":"${CANARY}","expires_in":"soon"}`),
        503,
        /"expires_in"/,
      ],
      [
        'expires_in overflowing a double',
        garbage(`{"access_token":"${CANARY}","expires_in":1e400}`),
        503,
        /"expires_in"/,
      ],
    ];

    beforeAll(async () => {
      // Callers asking for (almost) a whole lifetime force a refresh while the token ages.
      const current = provider.stats.issued.at(-1)!;
      await delay(Math.max(0, current.issuedAt + 1500 - Date.now()));
    });

    afterAll(() => provider.setKnobs({ tokenFailure: null }));

    it.each(providerCases)(
      '%s: the caller is told what went wrong, the old token is still served',
      async (_name, failure, status, detail) => {
        provider.setKnobs({ tokenFailure: failure });
        const before = provider.stats.tokenRequests;
        const answer = await call('GET', `/token?min_ttl=${PROVIDER_LIFETIME_S - 1}`);
        expect(provider.stats.tokenRequests).toBeGreaterThan(before);
        expect(answer.status).toBe(status);
        expect(answer.retryAfter).toMatch(/^[1-9]\d*$/);
        const problem = problemOf(answer);
        expect(problem.code).toBe('token_unavailable');
        expect(problem.detail).toMatch(detail);
        expect(answer.body).not.toContain(CANARY);
        await stillServing(broker, provider);
      },
    );

    it('absurd expires_in: believed for a day at most', async () => {
      const issued = provider.stats.tokensIssued;
      provider.setKnobs({ tokenFailure: null });
      // The provider's own answer: a real token with a lifetime of 31,700 years.
      const emulatorWithAbsurdLifetime = 1e12;
      provider.setKnobs({ tokenLifetimeSeconds: emulatorWithAbsurdLifetime });
      try {
        const answer = await call('GET', `/token?min_ttl=${PROVIDER_LIFETIME_S - 1}`);
        expect(answer.status).toBe(200);
        const body = JSON.parse(answer.body) as TokenBody;
        expect(provider.stats.tokensIssued).toBeGreaterThan(issued);
        expect(body.expires_in).toBeLessThanOrEqual(86_400);
        expect(Date.parse(body.expires_at) - Date.now()).toBeLessThanOrEqual(86_400_000);
      } finally {
        provider.setKnobs({ tokenLifetimeSeconds: PROVIDER_LIFETIME_S });
      }
      await stillServing(broker, provider);
    });
  });

  describe('corrupt or foreign values in Redis', () => {
    const key = redisKeys.token(REDIS_CLIENT);
    const foreignCipher = new AesGcmTokenCipher(randomBytes(32));
    const ownCipher = new AesGcmTokenCipher(cacheKey);
    const future = () => String(Date.now() + 60_000);
    const redisCases: Array<[string, (r: Redis) => Promise<unknown>]> = [
      [
        'value that is not sealed at all',
        (r) =>
          r.hset(key, {
            exp: future(),
            obt: String(Date.now()),
            fp: 'f',
            val: `garbage ${CANARY}`,
          }),
      ],
      [
        'value sealed for another client',
        (r) =>
          r.hset(key, {
            exp: future(),
            obt: String(Date.now()),
            fp: 'f',
            val: ownCipher.seal('another-client', CANARY),
          }),
      ],
      [
        'value sealed with another key',
        (r) =>
          r.hset(key, {
            exp: future(),
            obt: String(Date.now()),
            fp: 'f',
            val: foreignCipher.seal(REDIS_CLIENT, CANARY),
          }),
      ],
      [
        'value written in clear by an unencrypted broker',
        (r) =>
          r.hset(key, { exp: future(), obt: String(Date.now()), fp: 'f', val: `plain:${CANARY}` }),
      ],
      [
        'tampered ciphertext',
        (r) =>
          r.hset(key, {
            exp: future(),
            obt: String(Date.now()),
            fp: 'f',
            val: ownCipher.seal(REDIS_CLIENT, CANARY).slice(0, -4) + 'AAAA',
          }),
      ],
      [
        'expiry that is not a number',
        (r) =>
          r.hset(key, {
            exp: 'soon',
            obt: String(Date.now()),
            fp: 'f',
            val: ownCipher.seal(REDIS_CLIENT, CANARY),
          }),
      ],
      [
        'absurd expiry and no value',
        (r) => r.hset(key, { exp: '9000000000000000', obt: '1', fp: 'f' }),
      ],
      [
        'invalidation marker that is not a number, absurd expiry',
        (r) => r.hset(key, { exp: '9000000000000000', inv: 'yes', fp: 'f' }),
      ],
      ['a string where a hash belongs', (r) => r.set(key, CANARY)],
      ['a list where a hash belongs', (r) => r.rpush(key, CANARY, CANARY)],
    ];

    it.each(redisCases)('%s: discarded and replaced by a fresh token', async (_name, write) => {
      await raw.del(key);
      await write(raw);
      const writtenAt = Date.now();
      // The next refresh (every ~2 s) reads Redis, discards the value and stores a fresh token.
      const healed = await waitFor(
        async () => {
          if ((await raw.type(key)) !== 'hash') return undefined;
          const fp = await raw.hget(key, 'fp');
          const fresh = redisProvider.stats.issued.find(
            (g) => g.issuedAt > writtenAt && fingerprintOf(g.token) === fp,
          );
          return fresh;
        },
        {
          timeoutMs: REDIS_LIFETIME_S * 2500,
          intervalMs: 50,
          what: 'Redis to hold a fresh token again',
        },
      );
      await waitFor(
        async () => {
          const res = await send(redisBroker.url, 'GET', '/token');
          return (
            res.status === 200 && (JSON.parse(res.body) as TokenBody).access_token === healed.token
          );
        },
        { timeoutMs: REDIS_LIFETIME_S * 1000, what: 'the broker to serve the fresh token' },
      );
      await stillServing(redisBroker, redisProvider);
    });

    it('garbage pub/sub messages on the client channel are ignored', async () => {
      const channel = redisKeys.events(REDIS_CLIENT);
      for (const message of [
        'u:abc',
        'u:',
        'i:',
        'x',
        'u:1e400',
        `u:${'9'.repeat(30)}`,
        `i:${CANARY}`,
        '',
      ]) {
        await raw.publish(channel, message);
      }
      await delay(200);
      await stillServing(redisBroker, redisProvider);
    });
  });

  describe('configuration', () => {
    const badSettings: Array<[string, Record<string, string>]> = [
      ['PORT', { PORT: `port-${CANARY}` }],
      ['REDIS_URL', { REDIS_URL: `http://user:${CANARY}@redis.example` }],
      ['TOKEN_REFRESH_AHEAD_SECONDS', { TOKEN_REFRESH_AHEAD_SECONDS: `-5${CANARY}` }],
      ['TOKEN_LOCK_TTL_MS', { TOKEN_LOCK_TTL_MS: '0' }],
      ['REDIS_COMMAND_TIMEOUT_MS', { REDIS_COMMAND_TIMEOUT_MS: CANARY }],
      ['PROVIDER_AUTH_URL', { PROVIDER_AUTH_URL: `ftp://${CANARY}.example` }],
      ['CLIENT_ID', { CLIENT_ID: `Upper_${CANARY}` }],
      ['CALLER_AUTH_MODE', { CALLER_AUTH_MODE: CANARY }],
      // Cross-field: the lead must be shorter than the default lifetime (1800 s).
      ['TOKEN_REFRESH_AHEAD_SECONDS', { TOKEN_REFRESH_AHEAD_SECONDS: '4000' }],
      [
        'CREDENTIALS_SECRET_ID or CREDENTIALS_FILE',
        { CREDENTIALS_FILE: '', CREDENTIALS_SECRET_ID: '' },
      ],
      // Token request profiles: a method the provider's dialect cannot send, and a header
      // that would carry a secret past the credentials.
      ['TOKEN_REQUEST_AUTH', { TOKEN_REQUEST_AUTH: 'private_key_jwt' }],
      [
        'TOKEN_REQUEST_HEADERS',
        {
          TOKEN_REQUEST_GRANT: 'rfc6749',
          TOKEN_REQUEST_URL: 'https://auth.example/token',
          TOKEN_REQUEST_HEADERS: `{"Authorization":"Bearer ${CANARY}"}`,
        },
      ],
    ];
    const outcomes: Array<Promise<{ code: number | null; output: string }>> = [];
    /** The client set by the single-client variables, as the bad settings below are. */
    let clientEnv: Record<string, string | undefined>;

    /** Starts the broker with one bad setting and resolves with how it ended. */
    async function exitOf(env: Record<string, string>, i: number) {
      const { process: b } = await stack.addBroker({
        name: `bad-config-${i}`,
        env: { ...clientEnv, ...env },
        wait: 'none',
      });
      spawned.push(b!);
      const exit = await b!.exited;
      return { code: exit.code, output: b!.logs().join('\n') };
    }

    beforeAll(() => {
      const credentialsFile = join(stack.dir, 'env-credentials.json');
      writeFileSync(credentialsFile, JSON.stringify(CREDS), { mode: 0o600 });
      clientEnv = {
        BROKER_CONFIG_FILE: undefined,
        CLIENT_ID: CLIENT,
        CREDENTIALS_FILE: credentialsFile,
        PROVIDER_AUTH_URL: provider.url,
        PROVIDER_BASE_URL: provider.url,
      };
      // Two at a time: each is a whole Node start-up (about a CPU second), and they do not
      // interact; one by one would take longer, all at once can starve a small CI machine.
      const previous: Promise<unknown>[] = [Promise.resolve(), Promise.resolve()];
      badSettings.forEach(([, env], i) => {
        const started = previous[i % 2].then(() => exitOf(env, i));
        outcomes.push(started);
        previous[i % 2] = started.catch(() => undefined);
      });
    });

    it.each(badSettings.map(([name, env], i) => [name, Object.keys(env).join(','), i] as const))(
      '%s (set via %s): exit 78, naming the setting and not the value',
      async (setting, _vars, i) => {
        const { code, output } = await outcomes[i];
        expect(code).toBe(78);
        expect(output).toContain(setting);
        expect(output).not.toContain(CANARY);
      },
      30_000,
    );
  });

  it('no crash, and no token, secret or key in any answer or log line', async () => {
    expect(broker.isRunning() && redisBroker.isRunning()).toBe(true);
    // A graceful stop flushes the brokers' buffered logs, so the check below sees every line.
    const exits = await Promise.all([broker.stop(), redisBroker.stop()]);
    expect(exits.map((e) => e.code)).toEqual([0, 0]);
    const outputs = [...spawned.flatMap((b) => b.logs()), ...answers].join('\n');
    expect(outputs).toContain('"level":"debug"');
    const secrets = [
      ...provider.stats.issued.map((t) => t.token),
      ...redisProvider.stats.issued.map((t) => t.token),
      CREDS.client_secret,
      cacheKey.toString('base64'),
      cacheKey.toString('hex'),
      CANARY,
    ];
    const leaked = secrets.filter((s) => outputs.includes(s));
    console.log(
      `[fault:bad-input] answers checked=${answers.length} log lines checked=${spawned.reduce((n, b) => n + b.logs().length, 0)} ` +
        `provider requests=${provider.stats.tokenRequests}+${redisProvider.stats.tokenRequests} leaked=${leaked.length}`,
    );
    expect(leaked).toEqual([]);
  }, 20_000);
});
