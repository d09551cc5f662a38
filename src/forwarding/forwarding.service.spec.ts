import { Readable } from 'node:stream';
import pino from 'pino';
import { Counter, Histogram, Registry } from 'prom-client';
import { brokerConfigSchema } from '../config/config.schema';
import { testConfig } from '../../test/support/test-config';
import { MemoryIdempotencyStore } from './idempotency-store.memory';
import { readOrderHeaders } from './order-request';
import type { ApiOutcome, ApiRequest, ProviderApiGateway } from '../provider/provider-api.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { type TokenRecord, toRecord } from '../token/token-record';
import { ForwardErrorCode, ForwardingException, OrdersErrorCode } from './forwarding.exception';
import { type ForwardCall, ForwardingService } from './forwarding.service';
import { parseForwardTarget } from './forward-target';

const config = testConfig({
  token: { waitTimeoutMs: 500 },
  forward: { maxStoredResponseBytes: 1024 },
});

function token(name: string): TokenRecord {
  const now = Date.now();
  return toRecord({ accessToken: name, obtainedAt: now, expiresAt: now + 600_000 });
}

/**
 * Tokens as the forwarding core sees them: a rejected one is replaced (fenced) by the next,
 * unless `verdict` says the bounds hold.
 */
function fakeTokens(verdict: 'floored' | 'caller_budget' | undefined = undefined) {
  let n = 0;
  let current = token('t0');
  const replaced: string[] = [];
  return {
    replaced,
    getForwardToken: async () => current,
    replaceRejected: async (_client: string, fp: string, _caller: string) => {
      replaced.push(fp);
      if (verdict !== undefined) return verdict;
      if (fp !== current.fingerprint) return 'stale' as const;
      current = token(`t${++n}`);
      return 'invalidated' as const;
    },
  };
}

/** RFC 6750's answer to a refused token. */
const REFUSED = { 'www-authenticate': 'Bearer realm="api", error="invalid_token"' };

type Step =
  | ApiOutcome
  | {
      status: number;
      body?: string | Readable;
      length?: boolean;
      headers?: Record<string, string>;
    };

/** A provider API answering from a script, one entry per call, recording the calls. */
class ScriptedApi implements ProviderApiGateway {
  readonly calls: ApiRequest[] = [];
  constructor(private readonly script: Step[]) {}

  async call(request: ApiRequest): Promise<ApiOutcome> {
    this.calls.push(request);
    const next = this.script.shift() ?? { status: 200 };
    if ('kind' in next) return next;
    const body = next.body ?? `{"n":${this.calls.length}}`;
    return {
      kind: 'answered',
      status: next.status,
      headers: { 'content-type': 'application/json', 'set-cookie': ['s=1'], ...next.headers },
      body: typeof body === 'string' ? Buffer.from(body) : body,
    };
  }
}

function failed(delivered: 'no' | 'maybe'): ApiOutcome {
  return {
    kind: 'failed',
    delivered,
    error: new ProviderException(ProviderErrorCode.Unreachable, 'connect failed'),
  };
}

function callOf(method: string, key?: string, body?: string): ForwardCall {
  const headers = key === undefined ? {} : { 'idempotency-key': key };
  return {
    profile: 'forward',
    client: config.clients[0],
    caller: 'checkout',
    method,
    target: parseForwardTarget('/provider/acme/api/marketing/v1/offers?amount=5'),
    headers: readOrderHeaders(headers, key === undefined ? [] : ['Idempotency-Key', key], 'r1'),
    passed: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : Buffer.from(body),
  };
}

async function codeOf(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof ForwardingException) return err.code;
    throw err;
  }
  return undefined;
}

describe(ForwardingService.name, () => {
  const registry = new Registry();
  const metrics = {
    providerLatency: new Histogram({
      name: 'latency',
      help: 'h',
      labelNames: ['call', 'status_class'] as const,
      registers: [registry],
    }),
    idempotentReplays: new Counter({
      name: 'replays',
      help: 'h',
      labelNames: ['client'] as const,
      registers: [registry],
    }),
    upstreamTokenEchoes: new Counter({
      name: 'echoes',
      help: 'h',
      labelNames: ['client', 'call'] as const,
      registers: [registry],
    }),
    tokenRejections: new Counter({
      name: 'rejections',
      help: 'h',
      labelNames: ['client', 'call', 'verdict'] as const,
      registers: [registry],
    }),
  };
  const logger = pino({ level: 'silent' });
  const service = (api: ProviderApiGateway, tokens = fakeTokens()) =>
    new ForwardingService(tokens, api, new MemoryIdempotencyStore(), config, metrics, logger);

  it('sends the path and query as given, and returns only the safe headers', async () => {
    const api = new ScriptedApi([{ status: 200 }]);
    const reply = await service(api).forward(callOf('GET'), { attempts: 0 });
    expect(api.calls[0]).toMatchObject({
      method: 'GET',
      target: '/api/marketing/v1/offers?amount=5',
    });
    expect(api.calls[0].accessToken).toBe('t0');
    expect(reply.headers).toEqual({ 'content-type': 'application/json' });
  });

  it('retries a GET or HEAD once when the connection was refused before sending', async () => {
    for (const method of ['GET', 'HEAD']) {
      const api = new ScriptedApi([failed('no'), { status: 200 }]);
      expect((await service(api).forward(callOf(method), { attempts: 0 })).status).toBe(200);
      expect(api.calls).toHaveLength(2);
    }
    const twice = new ScriptedApi([failed('no'), failed('no'), { status: 200 }]);
    expect(await codeOf(service(twice).forward(callOf('GET'), { attempts: 0 }))).toBe(
      ForwardErrorCode.ProviderUnreachable,
    );
    expect(twice.calls).toHaveLength(2);
  });

  it('never resends a POST, nor a GET that may have arrived', async () => {
    const post = new ScriptedApi([failed('no'), { status: 201 }]);
    expect(
      await codeOf(service(post).forward(callOf('POST', undefined, '{}'), { attempts: 0 })),
    ).toBe(ForwardErrorCode.ProviderUnreachable);
    expect(post.calls).toHaveLength(1);
    const get = new ScriptedApi([failed('maybe'), { status: 200 }]);
    expect(await codeOf(service(get).forward(callOf('GET'), { attempts: 0 }))).toBe(
      ForwardErrorCode.ProviderUnreachable,
    );
    expect(get.calls).toHaveLength(1);
  });

  it('drains a streamed 401 that says the token was refused, invalidates it (fenced) and retries once', async () => {
    const rejected = Readable.from([Buffer.from('{"error":"invalid_token"}')]);
    const api = new ScriptedApi([
      { status: 401, body: rejected, headers: REFUSED },
      { status: 201 },
    ]);
    const tokens = fakeTokens();
    const audit = { attempts: 0 };
    const reply = await service(api, tokens).forward(callOf('POST', undefined, '{"a":1}'), audit);
    expect(reply.status).toBe(201);
    expect(api.calls.map((c) => c.accessToken)).toEqual(['t0', 't1']);
    expect(api.calls[1].body?.toString()).toBe('{"a":1}');
    expect(tokens.replaced).toHaveLength(1);
    expect(audit.attempts).toBe(2);
    // The refused answer's body was drained, not left holding the connection.
    expect(rejected.readableFlowing).toBe(true);

    const always = new ScriptedApi([
      { status: 401, headers: REFUSED },
      { status: 401, headers: REFUSED },
    ]);
    expect(await codeOf(service(always).forward(callOf('GET'), { attempts: 0 }))).toBe(
      ForwardErrorCode.TokenRejected,
    );
  });

  it('relays a 401 that does not say the token was refused: nothing invalidated, nothing resent', async () => {
    const challenges: Record<string, string>[] = [
      {},
      { 'www-authenticate': 'Bearer realm="api", error="insufficient_scope"' },
    ];
    for (const headers of challenges) {
      const api = new ScriptedApi([{ status: 401, body: '{"error":"otp_invalid"}', headers }]);
      const tokens = fakeTokens();
      const reply = await service(api, tokens).forward(callOf('POST', undefined, '{}'), {
        attempts: 0,
      });
      expect(reply.status).toBe(401);
      expect(api.calls).toHaveLength(1);
      expect(tokens.replaced).toHaveLength(0);
    }
  });

  it('relays the 401 as it is when the rejection floor or the caller budget holds', async () => {
    for (const verdict of ['floored', 'caller_budget'] as const) {
      const api = new ScriptedApi([{ status: 401, body: 'no', headers: REFUSED }]);
      const tokens = fakeTokens(verdict);
      const reply = await service(api, tokens).forward(callOf('POST', 'kf', '{}'), {
        attempts: 0,
      });
      expect(reply.status).toBe(401);
      // Keyed: collected whole, so the relayed body is a Buffer.
      expect(Buffer.isBuffer(reply.body) && reply.body.toString()).toBe('no');
      expect(api.calls).toHaveLength(1);
      expect(tokens.replaced).toHaveLength(1);
    }
  });

  it("takes a client's body marker as evidence, and relays a long 401 body whole", async () => {
    const marked = brokerConfigSchema.parse({
      ...config,
      clients: [{ ...config.clients[0], tokenRejection: { bodyMarker: 'TOKEN_EXPIRED' } }],
    });
    const svc = (api: ProviderApiGateway, tokens = fakeTokens()) =>
      new ForwardingService(tokens, api, new MemoryIdempotencyStore(), marked, metrics, logger);
    const call = { ...callOf('GET'), client: marked.clients[0] };
    const hit = new ScriptedApi([
      { status: 401, body: Readable.from([Buffer.from('{"code":"TOKEN_EXPIRED"}')]) },
      { status: 200 },
    ]);
    expect((await svc(hit).forward(call, { attempts: 0 })).status).toBe(200);
    expect(hit.calls).toHaveLength(2);
    const long = 'x'.repeat(10_000) + 'TOKEN_EXPIRED';
    const miss = new ScriptedApi([
      {
        status: 401,
        body: Readable.from([Buffer.from(long.slice(0, 3000)), Buffer.from(long.slice(3000))]),
      },
    ]);
    const reply = await svc(miss).forward(call, { attempts: 0 });
    expect(reply.status).toBe(401);
    const chunks: Buffer[] = [];
    if (Buffer.isBuffer(reply.body)) chunks.push(reply.body);
    else for await (const c of reply.body) chunks.push(c as Buffer);
    expect(Buffer.concat(chunks).toString()).toBe(long);
    expect(miss.calls).toHaveLength(1);
  });

  it('replays a keyed request, and marks unknown an answer too large to store', async () => {
    const api = new ScriptedApi([{ status: 201 }, { status: 201, body: 'x'.repeat(2048) }]);
    const svc = service(api);
    const first = await svc.forward(callOf('POST', 'k1', '{}'), { attempts: 0 });
    const again = await svc.forward(callOf('POST', 'k1', '{}'), { attempts: 0 });
    expect(again).toMatchObject({ status: 201, replayed: true });
    expect(again.body).toEqual(first.body);
    expect(api.calls).toHaveLength(1);

    expect(await codeOf(svc.forward(callOf('POST', 'k2', '{}'), { attempts: 0 }))).toBe(
      ForwardErrorCode.ProviderBadResponse,
    );
    expect(await codeOf(svc.forward(callOf('POST', 'k2', '{}'), { attempts: 0 }))).toBe(
      ForwardErrorCode.OutcomeUnknown,
    );
    expect(api.calls).toHaveLength(2);
  });

  it('passes a provider 429 back, not retried, and frees the key', async () => {
    const api = new ScriptedApi([{ status: 429 }, { status: 201 }]);
    const svc = service(api);
    expect((await svc.forward(callOf('POST', 'k3', '{}'), { attempts: 0 })).status).toBe(429);
    expect(api.calls).toHaveLength(1);
    expect((await svc.forward(callOf('POST', 'k3', '{}'), { attempts: 0 })).status).toBe(201);
  });

  it('keeps passthrough records for FORWARD_IDEMPOTENCY_TTL_SECONDS (1 h), not the orders TTL', async () => {
    let now = Date.now();
    const store = new MemoryIdempotencyStore(() => now);
    const api = new ScriptedApi([{ status: 201 }, { status: 201 }]);
    const svc = new ForwardingService(fakeTokens(), api, store, config, metrics, logger);
    await svc.forward(callOf('POST', 'k-ttl', '{}'), { attempts: 0 });
    now += 3599_000;
    expect(await svc.forward(callOf('POST', 'k-ttl', '{}'), { attempts: 0 })).toMatchObject({
      replayed: true,
    });
    now += 2000;
    expect(await svc.forward(callOf('POST', 'k-ttl', '{}'), { attempts: 0 })).toMatchObject({
      replayed: false,
    });
    expect(api.calls).toHaveLength(2);
    await store.close();
  });

  it('refuses a keyed request past the per-caller bound of records (429, nothing sent), others still pass', async () => {
    const bounded = brokerConfigSchema.parse({
      ...config,
      forward: { ...config.forward, maxIdempotencyRecordsPerCaller: 2 },
    });
    const api = new ScriptedApi([]);
    const svc = new ForwardingService(
      fakeTokens(),
      api,
      new MemoryIdempotencyStore(),
      bounded,
      metrics,
      logger,
    );
    await svc.forward(callOf('POST', 'b1', '{}'), { attempts: 0 });
    await svc.forward(callOf('POST', 'b2', '{}'), { attempts: 0 });
    const err = await svc.forward(callOf('POST', 'b3', '{}'), { attempts: 0 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ForwardingException);
    expect((err as ForwardingException).code).toBe(OrdersErrorCode.IdempotencyRecordsExceeded);
    expect((err as ForwardingException).retryAfterSeconds).toBeGreaterThan(0);
    expect(api.calls).toHaveLength(2);
    // Repeats of held keys replay, and requests without a key need no record.
    expect(await svc.forward(callOf('POST', 'b1', '{}'), { attempts: 0 })).toMatchObject({
      replayed: true,
    });
    expect((await svc.forward(callOf('POST', undefined, '{}'), { attempts: 0 })).status).toBe(200);
  });

  describe('an answer that echoes the token', () => {
    async function read(body: Readable | Buffer): Promise<{ bytes: Buffer; error?: Error }> {
      if (Buffer.isBuffer(body)) return { bytes: body };
      const chunks: Buffer[] = [];
      try {
        for await (const chunk of body) chunks.push(chunk as Buffer);
      } catch (error) {
        return { bytes: Buffer.concat(chunks), error: error as Error };
      }
      return { bytes: Buffer.concat(chunks) };
    }
    const echoes = async () =>
      (await metrics.upstreamTokenEchoes.get()).values.find((v) => v.labels.call === 'forward')
        ?.value ?? 0;

    it('refuses a whole answer containing the token with 502, and counts it', async () => {
      const before = await echoes();
      const api = new ScriptedApi([{ status: 200, body: '{"authorization":"Bearer t0"}' }]);
      expect(await codeOf(service(api).forward(callOf('GET'), { attempts: 0 }))).toBe(
        ForwardErrorCode.UpstreamEchoedToken,
      );
      expect(await echoes()).toBe(before + 1);
    });

    it('refuses an answer whose returned headers carry the token', async () => {
      const api: ProviderApiGateway = {
        call: async () => ({
          kind: 'answered',
          status: 302,
          headers: { location: 'https://debug.example/?access_token=t0' },
          body: Buffer.alloc(0),
        }),
      };
      expect(await codeOf(service(api).forward(callOf('GET'), { attempts: 0 }))).toBe(
        ForwardErrorCode.UpstreamEchoedToken,
      );
    });

    it('refuses a streamed answer with the token split across two chunks', async () => {
      const api = new ScriptedApi([
        {
          status: 200,
          body: Readable.from([Buffer.from('{"seen":"Bearer t'), Buffer.from('0"}')]),
        },
      ]);
      expect(await codeOf(service(api).forward(callOf('GET'), { attempts: 0 }))).toBe(
        ForwardErrorCode.UpstreamEchoedToken,
      );
    });

    it('refuses the token it replaced after a 401 as well as the fresh one', async () => {
      const api = new ScriptedApi([
        { status: 401, headers: REFUSED },
        { status: 200, body: 'Bearer t0' },
      ]);
      expect(await codeOf(service(api).forward(callOf('GET'), { attempts: 0 }))).toBe(
        ForwardErrorCode.UpstreamEchoedToken,
      );
    });

    it('cuts off a long stream at a token found after relaying began, never relaying any of it', async () => {
      const pad = Buffer.alloc(70 * 1024, 'x');
      const api = new ScriptedApi([
        { status: 200, body: Readable.from([pad, Buffer.from('..t'), Buffer.from('0..'), pad]) },
      ]);
      const reply = await service(api).forward(callOf('GET'), { attempts: 0 });
      expect(reply.status).toBe(200);
      const { bytes, error } = await read(reply.body);
      expect(error).toBeDefined();
      expect(bytes.includes('t0')).toBe(false);
      expect(bytes.includes('..t')).toBe(false);
      // An answer without the token streams whole, byte for byte.
      const clean = new ScriptedApi([
        { status: 200, body: Readable.from([pad, pad, Buffer.from('t')]) },
      ]);
      const whole = await read((await service(clean).forward(callOf('GET'), { attempts: 0 })).body);
      expect(whole.error).toBeUndefined();
      expect(whole.bytes).toEqual(Buffer.concat([pad, pad, Buffer.from('t')]));
    });

    it('stores nothing of a keyed echo: a repeat answers 409 outcome unknown, never the echo', async () => {
      const api = new ScriptedApi([{ status: 201, body: 'Bearer t0' }]);
      const svc = service(api);
      const call = callOf('POST', 'k-echo', '{}');
      expect(await codeOf(svc.forward(call, { attempts: 0 }))).toBe(
        ForwardErrorCode.UpstreamEchoedToken,
      );
      expect(await codeOf(svc.forward(call, { attempts: 0 }))).toBe(
        ForwardErrorCode.OutcomeUnknown,
      );
      expect(api.calls).toHaveLength(1);
    });
  });
});
