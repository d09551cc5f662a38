import pino from 'pino';
import { TEST_CLIENT as CLIENT, testConfig } from '../../test/support/test-config';
import { MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import type { GrantedToken } from '../provider/token-response.parser';
import { ClientTokenManager } from './client-token-manager';
import { EndpointGates } from './endpoint-limiter';
import { type TokenRecord, toRecord } from './token-record';
import type { Locked } from './token-store';
import { MemoryTokenStore } from './token-store.memory';
import { TokenErrorCode, TokenException } from './token.exception';

// Nest 12 ships ES modules only, which Jest's CommonJS runtime cannot load; the metrics service
// only needs its decorator from it, which does nothing outside a Nest container anyway.
jest.mock('@nestjs/common', () => ({ Injectable: () => () => undefined }));

/** A provider that issues `fresh-<n>` for an hour and counts requests. */
class Grantor implements TokenGrantor {
  requests = 0;
  constructor(
    private readonly lifetimeMs = 3_600_000,
    /** How long the answer takes; the lifetime counts from the request. */
    private readonly latencyMs = 0,
  ) {}
  async requestToken(): Promise<GrantedToken> {
    const now = Date.now();
    if (this.latencyMs > 0) await new Promise((r) => setTimeout(r, this.latencyMs));
    return {
      accessToken: `fresh-${++this.requests}`,
      obtainedAt: now,
      expiresAt: now + this.lifetimeMs,
      lifetimeSeconds: this.lifetimeMs / 1000,
    };
  }
}

/** A token another replica obtained: valid for an hour. */
function fleetToken(accessToken: string): TokenRecord {
  const now = Date.now();
  return toRecord({ accessToken, obtainedAt: now, expiresAt: now + 3_600_000 });
}

/** What a caller was given: the token's time left, or the error. */
function outcome(p: Promise<TokenRecord>) {
  return p.then(
    (r) => ({ leftMs: r.expiresAt - Date.now(), error: undefined }),
    (e: TokenException) => ({ leftMs: undefined, error: e }),
  );
}

/** A promise and the function that settles it: a step of the store the test releases. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

function manager(
  store: MemoryTokenStore,
  grantor = new Grantor(),
  token: Record<string, number> = {},
  /** Whether it hears the store's events (false: a replica cut off from Redis). */
  listening = true,
  logger = pino({ level: 'silent' }),
): ClientTokenManager {
  const config = testConfig({ token });
  const m = new ClientTokenManager(config.clients[0], {
    store,
    grantor,
    loadCredentials: async () => ({ clientId: 'id', clientSecret: 'secret' }),
    metrics: new MetricsService(),
    logger,
    settings: config.token,
    storeGraceMs: 1000,
  });
  if (listening) store.onEvent((e) => m.onStoreEvent(e));
  return m;
}

describe(ClientTokenManager.name, () => {
  const managers: ClientTokenManager[] = [];
  afterEach(async () => {
    jest.useRealTimers();
    await Promise.all(managers.splice(0).map((m) => m.stop(100)));
  });

  it('warns once, naming TOKEN_REFRESH_AHEAD_SECONDS, when the lead is over half the lifetime', async () => {
    const lines: Array<{ level: number; msg: string }> = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[0]) },
    );
    const leadWarnings = () =>
      lines.filter((l) => l.level === 40 && l.msg.includes('TOKEN_REFRESH_AHEAD_SECONDS'));
    // 120 s tokens and the default 300 s lead: every token learnt, one line.
    const short = manager(new MemoryTokenStore(), new Grantor(120_000), {}, true, logger);
    managers.push(short);
    await short.get(0);
    await short.forceRefresh(Date.now() + 1000);
    expect(leadWarnings()).toHaveLength(1);
    expect(leadWarnings()[0].msg).toBe(
      `client "${CLIENT.id}": TOKEN_REFRESH_AHEAD_SECONDS (token.refreshAheadSeconds, 300 s) is more than half the provider's token lifetime (120 s), so the broker refreshes at half the lifetime instead: a provider request every 60 s or sooner, two or more per lifetime. Set it well below 60 s`,
    );
    // A lead that fits: nothing.
    lines.length = 0;
    const fits = manager(
      new MemoryTokenStore(),
      new Grantor(120_000),
      { refreshAheadSeconds: 30 },
      true,
      logger,
    );
    managers.push(fits);
    await fits.get(0);
    expect(leadWarnings()).toHaveLength(0);
  });

  it('never adopts a token rejected while its pass was releasing the lock', async () => {
    // The pass reads the fleet's token inside the lock, judges it good, then awaits the lock's
    // release: the provider's 401 for that very token lands in between.
    const old = fleetToken('fleet-old');
    const releasing = gate();
    const releaseStarted = gate();
    const store = new (class extends MemoryTokenStore {
      override async withRefreshLock<T>(clientId: string, fn: () => Promise<T>) {
        return super.withRefreshLock(clientId, async () => {
          // The read outside the lock missed; the previous holder wrote just after it.
          await super.writeFenced(clientId, old);
          const value = await fn();
          // Releasing: the pass has its result, the lock is not yet free.
          releaseStarted.open();
          await releasing.opened;
          return value;
        });
      }
    })();
    const grantor = new Grantor();
    const m = manager(store, grantor);
    managers.push(m);

    const first = m.get(2000);
    await releaseStarted.opened;
    expect(await m.reject(old.fingerprint, 'proxy')).toBe('invalidated');
    releasing.open();

    // The caller that asked before the rejection may not be handed the rejected token either.
    expect((await first).fingerprint).not.toBe(old.fingerprint);
    const after = await m.get(2000);
    expect(after.fingerprint).not.toBe(old.fingerprint);
    expect(after.accessToken).toBe('fresh-1');
    expect(m.peek(2000)?.fingerprint).toBe(after.fingerprint);
  });

  it('re-reads at once when the fleet publishes a token while its pass is in flight', async () => {
    jest.useFakeTimers();
    const store = new (class extends MemoryTokenStore {
      lockAsked = gate();
      lockAnswer = gate();
      override async withRefreshLock<T>(): Promise<Locked<T>> {
        this.lockAsked.open();
        await this.lockAnswer.opened;
        // Another replica holds the lock (it is the one writing the new token).
        return { acquired: false };
      }
    })();
    const grantor = new Grantor();
    const m = manager(store, grantor);
    managers.push(m);

    let served: TokenRecord | undefined;
    // Settled either way: shutdown rejects a caller still waiting when the test ends.
    void m.get(2000).then(
      (r) => (served = r),
      () => undefined,
    );
    await store.lockAsked.opened;
    // The other replica's write and its pub/sub message arrive while this pass waits on the lock.
    const fleet = fleetToken('fleet-new');
    await store.writeFenced(CLIENT.id, fleet);
    store.lockAnswer.open();

    // No timer runs: the loop must not sleep on a wake-up it already received.
    await jest.advanceTimersByTimeAsync(0);
    expect(served?.fingerprint).toBe(fleet.fingerprint);
    expect(grantor.requests).toBe(0);
  });

  describe('operators: revoke and forced refresh', () => {
    it('drops a revoked token at once, never serves it again, fetches one replacement and acknowledges', async () => {
      const store = new MemoryTokenStore();
      const grantor = new Grantor();
      const m = manager(store, grantor, { minRefreshIntervalMs: 5000 });
      managers.push(m);
      const leaked = await m.get(0);
      expect(leaked.accessToken).toBe('fresh-1');
      // The floor would hold a new grant back for 5 s: the revoke lifts it.
      const revocation = await store.revoke(CLIENT.id);
      expect(revocation).toEqual({ generation: 1, fingerprint: leaked.fingerprint, delivered: 1 });
      expect(m.peek(0)).toBeUndefined();
      const fresh = await m.get(0);
      expect(fresh.accessToken).toBe('fresh-2');
      expect(fresh.generation).toBe(1);
      expect(grantor.requests).toBe(2);
      expect(await store.revocationAcks(CLIENT.id, 1)).toBe(1);
      expect(m.adminStatus()).toMatchObject({
        fingerprint: fresh.fingerprint,
        generation: 1,
        lastRefresh: { outcome: 'fetched' },
      });
      // The old token cannot come back through the store either.
      expect(await store.writeFenced(CLIENT.id, leaked)).toBe(false);
    });

    it('after an outage, sets its token aside until it has read the generation, and drops it if revoked meanwhile', async () => {
      const store = new MemoryTokenStore();
      const grantor = new Grantor();
      // This replica does not hear the revoke (as if cut off from Redis).
      const m = manager(store, grantor, {}, false);
      managers.push(m);
      const held = await m.get(0);
      await store.revoke(CLIENT.id);
      expect(m.peek(0)?.fingerprint).toBe(held.fingerprint);
      const resync = m.resync();
      // Synchronously, before the store answered: the held token is not served.
      expect(m.peek(0)).toBeUndefined();
      await resync;
      const after = await m.get(0);
      expect(after.fingerprint).not.toBe(held.fingerprint);
      expect(after.generation).toBe(1);
      expect(grantor.requests).toBe(2);
    });

    it('keeps its token through an outage when nothing was revoked', async () => {
      const store = new MemoryTokenStore();
      const grantor = new Grantor();
      const m = manager(store, grantor);
      managers.push(m);
      const held = await m.get(0);
      await m.resync();
      expect(m.peek(0)?.fingerprint).toBe(held.fingerprint);
      expect(grantor.requests).toBe(1);
    });

    it('forced refresh: one provider request however many ask at once, the new token served at once', async () => {
      const store = new MemoryTokenStore();
      const grantor = new Grantor(3_600_000, 20);
      const m = manager(store, grantor, { minRefreshIntervalMs: 5000 });
      managers.push(m);
      const before = await m.get(0);
      await new Promise((r) => setTimeout(r, 150));
      const askedAt = Date.now();
      const results = await Promise.all([1, 2, 3].map(() => m.forceRefresh(askedAt)));
      // The floor (5 s) does not hold an operator back.
      expect(grantor.requests).toBe(2);
      expect(results.filter((r) => r.fetched)).toHaveLength(1);
      expect(new Set(results.map((r) => r.record.fingerprint)).size).toBe(1);
      expect(results[0].record.fingerprint).not.toBe(before.fingerprint);
      expect(m.peek(0)?.fingerprint).toBe(results[0].record.fingerprint);
    });
  });

  describe('token lifetimes and min_ttl (virtual time)', () => {
    /** Settles `p` into what a caller would see, with the time left when it was served. */
    it('min_ttl=1799 on 1800 s tokens: at most one forced refresh per floor', async () => {
      jest.useFakeTimers();
      const grantor = new Grantor(1_800_000);
      const m = manager(new MemoryTokenStore(), grantor);
      managers.push(m);
      await m.get(0);
      const minutes = 10;
      const calls: ReturnType<typeof outcome>[] = [];
      // One caller a second for ten virtual minutes, each asking (almost) a whole lifetime.
      for (let s = 0; s < minutes * 60; s++) {
        calls.push(outcome(m.get(1_799_000)));
        await jest.advanceTimersByTimeAsync(1000);
      }
      await jest.advanceTimersByTimeAsync(10_000);
      const seen = await Promise.all(calls);
      // The default floor (5 s): without it, one request per caller (600).
      console.log(
        `[lifetimes] min_ttl=1799 on 1800 s tokens, one caller/s for ${minutes} virtual min: ${grantor.requests} token requests`,
      );
      expect(grantor.requests).toBeLessThanOrEqual((minutes * 60) / 5 + 2);
      for (const s of seen) {
        if (s.error === undefined) {
          expect(s.leftMs).toBeGreaterThanOrEqual(1_799_000);
        } else {
          expect(s.error).toBeInstanceOf(TokenException);
          expect(s.error.code).toBe(TokenErrorCode.Unavailable);
          expect(s.error.message).toMatch(/requested min_ttl of 1799 s/);
          expect(s.error.message).toMatch(/at most once every 5 s/);
          expect(s.error.retryAfterSeconds).toBeGreaterThanOrEqual(1);
        }
      }
      expect(seen.some((s) => s.error === undefined)).toBe(true);
    });

    it('1 s tokens: never served, callers without min_ttl told the truth, readiness names it', async () => {
      jest.useFakeTimers();
      // The answer takes 100 ms: it arrives with 900 ms left, under the minimum.
      const grantor = new Grantor(1000, 100);
      const m = manager(new MemoryTokenStore(), grantor);
      managers.push(m);
      m.start();
      const calls: ReturnType<typeof outcome>[] = [];
      for (let s = 0; s < 80; s++) {
        calls.push(outcome(m.get(0)));
        await jest.advanceTimersByTimeAsync(500);
      }
      await jest.advanceTimersByTimeAsync(10_000);
      const seen = await Promise.all(calls);
      for (const s of seen) {
        expect(s.error).toBeInstanceOf(TokenException);
        expect(s.error!.message).not.toMatch(/requested min_ttl/);
        expect(s.error!.message).toMatch(/tokens live 1 s/);
        expect(s.error!.retryAfterSeconds).toBeGreaterThanOrEqual(1);
      }
      // 50 virtual seconds: one grant per floor (5 s), not one per caller.
      expect(grantor.requests).toBeLessThanOrEqual(50 / 5 + 1);
      expect(m.status()).toMatchObject({
        everObtained: false,
        hasToken: false,
        lifetimeError: `client "acme": the provider's tokens live 1 s, less than the 6 s the broker needs to serve and refresh them (TOKEN_MIN_REFRESH_INTERVAL_MS 5 s between tokens, plus 1 s left when served)`,
      });
    });

    it('a fresh token goes to the waiters it meets; the ones asking more than it lives are refused', async () => {
      // 60 s tokens from a provider answering in 50 ms: both callers wait for the first one.
      const m = manager(new MemoryTokenStore(), new Grantor(60_000, 50), {
        refreshAheadSeconds: 10,
      });
      managers.push(m);
      const plain = outcome(m.get(0));
      const asking = outcome(m.get(70_000));
      const [got, refused] = await Promise.all([plain, asking]);
      expect(got.error).toBeUndefined();
      expect(got.leftMs).toBeGreaterThan(55_000);
      expect(refused.error?.message).toMatch(
        /tokens live 60 s, less than the requested min_ttl of 70 s/,
      );
      expect(m.status()).toMatchObject({ state: 'fresh', hasToken: true });
    });

    it('shutdown refuses the callers still waiting, with shutting_down, and later ones too', async () => {
      // An answer that takes longer than the shutdown waits for it.
      const m = manager(new MemoryTokenStore(), new Grantor(60_000, 2_000));
      const waiting = outcome(m.get(0));
      await new Promise((r) => setTimeout(r, 20));
      await m.stop(50);
      const { error } = await waiting;
      expect(error?.code).toBe(TokenErrorCode.ShuttingDown);
      await expect(m.get(0)).rejects.toMatchObject({ code: TokenErrorCode.ShuttingDown });
    });
  });

  describe("clients of one token endpoint, through this process's gate", () => {
    /** Clients `a`..: one endpoint, one place at the gate. */
    function sharing(ids: string[], grantor: Grantor) {
      const config = testConfig({ clients: ids.map((id) => ({ ...CLIENT, id })) });
      const gates = new EndpointGates();
      const store = new MemoryTokenStore();
      return ids.map((_, i) => {
        const m = new ClientTokenManager(config.clients[i], {
          store,
          grantor,
          loadCredentials: async () => ({ clientId: 'id', clientSecret: 'secret' }),
          metrics: new MetricsService(),
          logger: pino({ level: 'silent' }),
          settings: config.token,
          storeGraceMs: 1000,
          endpointCap: { concurrency: 1, perSecond: 0, leaseMs: 10_000 },
          gates,
        });
        managers.push(m);
        return m;
      });
    }

    it("one refresh at a time; the others wait in turn, a caller's first", async () => {
      const grantor = new Grantor(3_600_000, 30);
      const [a, b, c] = sharing(['a', 'b', 'c'], grantor);
      for (const m of [a, b, c]) m.start();
      // `c` queued behind `b`: its caller moves it up.
      const forC = outcome(c.get(0));
      const { error } = await forC;
      expect(error).toBeUndefined();
      expect(c.status().hasToken).toBe(true);
      expect(b.status().hasToken).toBe(false);
      await Promise.all([a.get(0), b.get(0)]);
      expect(grantor.requests).toBe(3);
    });

    it('a client stopped while waiting its turn stops at once, its callers told', async () => {
      const grantor = new Grantor(3_600_000, 600);
      const [a, b] = sharing(['a', 'b'], grantor);
      a.start();
      b.start();
      const waiting = outcome(b.get(0));
      const from = Date.now();
      await b.stop(5_000);
      expect(Date.now() - from).toBeLessThan(500);
      expect((await waiting).error?.code).toBe(TokenErrorCode.ShuttingDown);
      await a.stop(5_000);
      expect(grantor.requests).toBe(1);
    });
  });
});
