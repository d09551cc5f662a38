import pino from 'pino';
import { TEST_CLIENT, testConfig } from '../../test/support/test-config';
import { Counter, Histogram, Registry } from 'prom-client';
import type { ApiOutcome, ApiRequest, ProviderApiGateway } from '../provider/provider-api.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import { type TokenRecord, toRecord } from '../token/token-record';
import { TokenErrorCode, TokenException } from '../token/token.exception';
import type { RejectionVerdict } from '../token/token-store';
import type { TokenService } from '../token/token.service';
import { IdempotencyStoreErrorCode, IdempotencyStoreException } from './idempotency-store';
import { MemoryIdempotencyStore } from './idempotency-store.memory';
import {
  bodyFingerprint,
  idempotencyKeyHash,
  type OrderHeaders,
  readOrderHeaders,
} from './order-request';
import { OrdersErrorCode, ForwardingException } from './forwarding.exception';
import {
  type ForwardCall,
  type ForwardingAudit,
  type ForwardReply,
  ForwardingService,
} from './forwarding.service';

const CLIENT = TEST_CLIENT.id;
const config = testConfig({ token: { waitTimeoutMs: 500 } });

function token(name: string): TokenRecord {
  const now = Date.now();
  return toRecord({ accessToken: name, obtainedAt: now, expiresAt: now + 600_000 });
}

/**
 * The token side as the forwarding service sees it (the {@link TokenService} facade): a current
 * token that `replaceRejected` replaces, like the real manager's refresh would, with a counter
 * of tokens fetched.
 */
class FakeTokens {
  current: TokenRecord = token('t0');
  fetched = 0;
  invalidations: string[] = [];
  /**
   * Tokens memory holds before the current one, to imitate a stale read. As in the real token
   * layer, a token once rejected is never handed out again.
   */
  staleReads: TokenRecord[] = [];
  private readonly rejected = new Set<string>();
  unavailable = false;

  asService(): Pick<TokenService, 'resolveClient' | 'getForwardToken' | 'replaceRejected'> {
    return {
      resolveClient: (client) => client ?? CLIENT,
      getForwardToken: async (): Promise<TokenRecord> => {
        if (this.unavailable)
          throw new TokenException(TokenErrorCode.Unavailable, 'no token', {
            retryAfterSeconds: 1,
          });
        let stale = this.staleReads.shift();
        while (stale !== undefined && this.rejected.has(stale.fingerprint)) {
          stale = this.staleReads.shift();
        }
        return stale ?? this.current;
      },
      replaceRejected: (client, fp) => this.invalidate(client, fp),
    };
  }

  async invalidate(_client: string, fp: string): Promise<RejectionVerdict> {
    this.invalidations.push(fp);
    this.rejected.add(fp);
    if (this.current.fingerprint !== fp) return 'stale';
    this.current = token(`t${++this.fetched}`);
    return 'invalidated';
  }
}

/** A provider that answers from a script, one entry per call, and records what it got. */
class ScriptedCheckout implements ProviderApiGateway {
  readonly calls: ApiRequest[] = [];
  constructor(private readonly script: Array<ApiOutcome | number>) {}

  async call(request: ApiRequest): Promise<ApiOutcome> {
    this.calls.push(request);
    const next = this.script.shift() ?? 201;
    return typeof next === 'number'
      ? {
          kind: 'answered',
          status: next,
          headers: { 'content-type': 'application/json' },
          body: Buffer.from(`{"status":${next}}`),
        }
      : next;
  }
}

function failed(delivered: 'no' | 'maybe', code: ProviderErrorCode): ApiOutcome {
  return { kind: 'failed', delivered, error: new ProviderException(code, 'create-order failed') };
}

/** A `POST /orders` as the route hands it over, before its profile's fixed target. */
interface OrderRequest {
  readonly clientId: string;
  readonly caller: string;
  readonly body: Buffer;
  readonly headers: OrderHeaders;
}

function orderWith(key?: string, body = '{"price":500}'): OrderRequest {
  const headers = key === undefined ? {} : { 'idempotency-key': key };
  const raw = key === undefined ? [] : ['Idempotency-Key', key];
  return {
    clientId: CLIENT,
    caller: 'checkout',
    body: Buffer.from(body),
    headers: readOrderHeaders(headers, raw, 'r1'),
  };
}

async function codeOf(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof ForwardingException || err instanceof TokenException) return err.code;
    throw err;
  }
  return undefined;
}

describe(`${ForwardingService.name} for orders`, () => {
  let tokens: FakeTokens;
  let store: MemoryIdempotencyStore;
  const logger = pino({ level: 'silent' });

  let replays: Counter<'client'>;
  let echoes: Counter<'client' | 'call'>;
  let latency: Histogram<'call' | 'status_class'>;
  let rejections: Counter<'client' | 'call' | 'verdict'>;

  function service(checkout: ProviderApiGateway, s = store) {
    const metrics = {
      providerLatency: latency,
      idempotentReplays: replays,
      upstreamTokenEchoes: echoes,
      tokenRejections: rejections,
    };
    const svc = new ForwardingService(tokens.asService(), checkout, s, config, metrics, logger);
    const client = config.clients[0];
    return {
      // What the route sends for `POST /orders`: its profile, fixed target and JSON headers.
      create: (order: OrderRequest, a: ForwardingAudit): Promise<ForwardReply> =>
        svc.forward(
          {
            profile: 'orders',
            client,
            caller: order.caller,
            method: 'POST',
            target: { clientId: client.id, path: client.ordersPath, query: '' },
            headers: order.headers,
            passed: { 'content-type': 'application/json', accept: 'application/json' },
            body: order.body,
          } satisfies ForwardCall,
          a,
        ),
    };
  }

  const audit = (): ForwardingAudit => ({ attempts: 0 });

  beforeEach(() => {
    tokens = new FakeTokens();
    store = new MemoryIdempotencyStore();
    const registry = new Registry();
    replays = new Counter({
      name: 'replays',
      help: 'h',
      labelNames: ['client'] as const,
      registers: [registry],
    });
    echoes = new Counter({
      name: 'echoes',
      help: 'h',
      labelNames: ['client', 'call'] as const,
      registers: [registry],
    });
    rejections = new Counter({
      name: 'rejections',
      help: 'h',
      labelNames: ['client', 'call', 'verdict'] as const,
      registers: [registry],
    });
    latency = new Histogram({
      name: 'latency',
      help: 'h',
      labelNames: ['call', 'status_class'] as const,
      registers: [registry],
    });
  });

  afterEach(async () => {
    await store.close();
  });

  describe('provider 401', () => {
    it('invalidates the token it used, by fingerprint, and retries once with another token', async () => {
      const checkout = new ScriptedCheckout([401, 201]);
      const used = tokens.current;
      const a = audit();
      const reply = await service(checkout).create(orderWith(), a);
      expect(reply.status).toBe(201);
      expect(tokens.invalidations).toEqual([used.fingerprint]);
      expect(checkout.calls.map((c) => c.accessToken)).toEqual(['t0', 't1']);
      expect(a).toMatchObject({ attempts: 2, tokenFingerprint: tokens.current.fingerprint });
    });

    it('waits for a token other than the rejected one when memory briefly still holds it', async () => {
      const checkout = new ScriptedCheckout([401, 201]);
      const rejected = tokens.current;
      // A store read that began before the invalidation hands the rejected token back twice.
      tokens.staleReads = [rejected, rejected, rejected];
      const reply = await service(checkout).create(orderWith(), audit());
      expect(reply.status).toBe(201);
      expect(checkout.calls.map((c) => c.accessToken)).toEqual(['t0', 't1']);
      expect(tokens.invalidations.every((fp) => fp === rejected.fingerprint)).toBe(true);
    });

    it('gives up with 502 after a second 401, invalidates that token too and frees the key', async () => {
      const checkout = new ScriptedCheckout([401, 401]);
      const svc = service(checkout);
      expect(await codeOf(svc.create(orderWith('k1'), audit()))).toBe(
        OrdersErrorCode.TokenRejected,
      );
      expect(tokens.invalidations).toHaveLength(2);
      expect(checkout.calls).toHaveLength(2);
      // Nothing was created: the same key may be sent again.
      expect((await svc.create(orderWith('k1'), audit())).status).toBe(201);
    });

    it('never retries any other status', async () => {
      for (const status of [400, 403, 409, 422, 500, 502, 503]) {
        const checkout = new ScriptedCheckout([status]);
        expect((await service(checkout).create(orderWith(), audit())).status).toBe(status);
        expect(checkout.calls).toHaveLength(1);
      }
    });
  });

  describe('failures', () => {
    it.each([
      [
        'not sent: connection refused',
        'free',
        failed('no', ProviderErrorCode.Unreachable),
        OrdersErrorCode.ProviderUnreachable,
      ],
      [
        'sent, then timed out',
        'unknown',
        failed('maybe', ProviderErrorCode.Timeout),
        OrdersErrorCode.ProviderTimeout,
      ],
      [
        'sent, then reset',
        'unknown',
        failed('maybe', ProviderErrorCode.Unreachable),
        OrdersErrorCode.ProviderUnreachable,
      ],
      [
        'answered too large',
        'unknown',
        failed('maybe', ProviderErrorCode.MalformedResponse),
        OrdersErrorCode.ProviderBadResponse,
      ],
    ])('%s: never retried; the key is %s afterwards', async (_label, after, outcome, code) => {
      const checkout = new ScriptedCheckout([outcome]);
      const svc = service(checkout);
      expect(await codeOf(svc.create(orderWith('k'), audit()))).toBe(code);
      expect(checkout.calls).toHaveLength(1);
      const repeat = svc.create(orderWith('k'), audit());
      if (after === 'free') {
        expect((await repeat).status).toBe(201);
        expect(checkout.calls).toHaveLength(2);
      } else {
        expect(await codeOf(repeat)).toBe(OrdersErrorCode.OutcomeUnknown);
        expect(checkout.calls).toHaveLength(1);
      }
    });

    it('frees the key when no token could be had: nothing was sent', async () => {
      tokens.unavailable = true;
      const checkout = new ScriptedCheckout([]);
      const svc = service(checkout);
      expect(await codeOf(svc.create(orderWith('k'), audit()))).toBe(TokenErrorCode.Unavailable);
      tokens.unavailable = false;
      expect((await svc.create(orderWith('k'), audit())).status).toBe(201);
      expect(checkout.calls).toHaveLength(1);
    });
  });

  describe('idempotency', () => {
    it('stores every answer but 429 (refused before processing, so a retry is safe)', async () => {
      const checkout = new ScriptedCheckout([429, 503]);
      const svc = service(checkout);
      expect((await svc.create(orderWith('k'), audit())).status).toBe(429);
      expect((await svc.create(orderWith('k'), audit())).status).toBe(503);
      const replay = await svc.create(orderWith('k'), audit());
      expect(replay).toMatchObject({ status: 503, replayed: true });
      expect(checkout.calls).toHaveLength(2);
      expect((await replays.get()).values).toEqual([{ labels: { client: CLIENT }, value: 1 }]);
    });

    it('treats a claim whose lease ran out (its holder died) as an unknown outcome', async () => {
      const checkout = new ScriptedCheckout([]);
      const svc = service(checkout);
      const order = orderWith('k');
      await store.claim(
        { clientId: CLIENT, caller: 'checkout', keyHash: idempotencyKeyHash('k') },
        {
          bodyHash: bodyFingerprint(order.body),
          owner: 'dead-replica',
          leaseMs: 0,
        },
        60_000,
      );
      expect(await codeOf(svc.create(order, audit()))).toBe(OrdersErrorCode.OutcomeUnknown);
      expect(checkout.calls).toHaveLength(0);
      // Truthful: nobody knows whether it was even sent (unlike an answer lost after sending).
      const problem = svc.create(order, audit());
      await expect(problem).rejects.toThrow(/cannot know whether that order was sent/);
      await expect(problem).rejects.not.toThrow(/answer was lost/);
    });

    it('fails closed when the store is down, for keyed orders only', async () => {
      class DownStore extends MemoryIdempotencyStore {
        override async claim(): Promise<never> {
          throw new IdempotencyStoreException(IdempotencyStoreErrorCode.Unavailable, 'down');
        }
      }
      const down = new DownStore();
      const checkout = new ScriptedCheckout([]);
      const svc = service(checkout, down);
      expect(await codeOf(svc.create(orderWith('k'), audit()))).toBe(
        OrdersErrorCode.IdempotencyUnavailable,
      );
      expect(checkout.calls).toHaveLength(0);
      expect((await svc.create(orderWith(), audit())).status).toBe(201);
      await down.close();
    });

    it("still gives the caller the provider's answer when recording it fails", async () => {
      class FlakyStore extends MemoryIdempotencyStore {
        override async settle(...args: Parameters<MemoryIdempotencyStore['settle']>) {
          if (args[2].state !== 'completed') return super.settle(...args);
          throw new IdempotencyStoreException(IdempotencyStoreErrorCode.Unavailable, 'down');
        }
      }
      const flaky = new FlakyStore();
      const reply = await service(new ScriptedCheckout([201]), flaky).create(
        orderWith('k'),
        audit(),
      );
      expect(reply.status).toBe(201);
      await flaky.close();
    });
  });

  it('withholds an answer that echoes the token (502), and a keyed repeat is 409, not the echo', async () => {
    const echo: ApiOutcome = {
      kind: 'answered',
      status: 201,
      headers: { 'content-type': 'application/json' },
      body: Buffer.from('{"debug":{"authorization":"Bearer t0"}}'),
    };
    const checkout = new ScriptedCheckout([echo]);
    const svc = service(checkout);
    expect(await codeOf(svc.create(orderWith('k-echo'), audit()))).toBe(
      OrdersErrorCode.UpstreamEchoedToken,
    );
    expect(await codeOf(svc.create(orderWith('k-echo'), audit()))).toBe(
      OrdersErrorCode.OutcomeUnknown,
    );
    expect(checkout.calls).toHaveLength(1);
    expect((await echoes.get()).values[0]?.value).toBe(1);
  });
});
