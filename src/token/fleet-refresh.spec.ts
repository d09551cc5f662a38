import pino from 'pino';
import { Counter, Histogram, Registry } from 'prom-client';
import { testClient } from '../../test/support/test-config';
import type { TokenGrantor } from '../provider/auth-server.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import type { GrantedToken } from '../provider/token-response.parser';
import type { ClientCredentials } from '../secrets/client-credentials';
import { CredentialsCache } from '../secrets/credentials-cache';
import { FleetRefresh, type FleetRefreshDeps, type RefreshContext } from './fleet-refresh';
import { type TokenRecord, toRecord } from './token-record';
import type { Locked } from './token-store';
import { TokenStoreErrorCode, TokenStoreException } from './token-store.exception';
import { MemoryTokenStore } from './token-store.memory';

const CLIENT = 'acme';
const client = testClient({ id: CLIENT, credentials: { secretId: 'token-broker/acme' } });
const FIRST = { clientId: 'acme', clientSecret: 'one' };
const SECOND = { clientId: 'acme', clientSecret: 'two' };
const HOUR = 3_600_000;

function record(name: string, lifetimeMs = HOUR): TokenRecord {
  const now = Date.now();
  return toRecord({ accessToken: name, obtainedAt: now, expiresAt: now + lifetimeMs });
}

/** A provider that accepts `accepted` credentials and counts requests. */
class Grantor implements TokenGrantor {
  calls: ClientCredentials[] = [];
  accepted: ClientCredentials = FIRST;
  failure?: Error;
  lifetimeMs = HOUR;

  async requestToken(_c: unknown, credentials: ClientCredentials): Promise<GrantedToken> {
    this.calls.push(credentials);
    if (this.failure) throw this.failure;
    if (credentials.clientSecret !== this.accepted.clientSecret) {
      throw new ProviderException(ProviderErrorCode.InvalidClient, 'refused', { status: 401 });
    }
    const now = Date.now();
    return {
      accessToken: `token-${this.calls.length}`,
      obtainedAt: now,
      expiresAt: now + this.lifetimeMs,
      lifetimeSeconds: this.lifetimeMs / 1000,
    };
  }
}

/** The in-memory store (same fence rules as Redis), with a hook on lock and a switchable outage. */
class Store extends MemoryTokenStore {
  down = false;
  lockCount = 0;
  releases = 0;
  beforeLock?: () => Promise<void>;
  /** Another replica holds the refresh lock. */
  heldElsewhere = false;

  override async read(clientId: string) {
    if (this.down) throw new TokenStoreException(TokenStoreErrorCode.Unavailable, 'down');
    return super.read(clientId);
  }

  override async withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>> {
    await this.beforeLock?.();
    if (this.heldElsewhere) return { acquired: false };
    return super.withRefreshLock(clientId, async () => {
      this.lockCount++;
      try {
        return await fn();
      } finally {
        this.releases++;
      }
    });
  }
}

function metrics(): FleetRefreshDeps['metrics'] {
  const registers = [new Registry()];
  return {
    lockAttempts: new Counter({
      name: 'l',
      help: 'l',
      labelNames: ['result'],
      registers,
    }),
    refreshes: new Counter({ name: 'r', help: 'r', labelNames: ['result'], registers }),
    cacheLookups: new Counter({
      name: 'c',
      help: 'c',
      labelNames: ['layer', 'outcome'],
      registers,
    }),
    providerLatency: new Histogram({
      name: 'p',
      help: 'p',
      labelNames: ['call', 'status_class'],
      registers,
    }),
  };
}

async function count(counter: Counter, result: string): Promise<number> {
  const { values } = await counter.get();
  return values.filter((v) => v.labels.result === result).reduce((s, v) => s + v.value, 0);
}

describe(FleetRefresh.name, () => {
  let store: Store;
  let grantor: Grantor;
  let secret: ClientCredentials;
  let now: number;
  let deps: FleetRefreshDeps;
  let credentials: CredentialsCache;
  let held: TokenRecord | undefined;
  /** Every token is good enough unless a test says otherwise. */
  let goodEnough: (r: TokenRecord) => boolean;
  const ctx: RefreshContext = { held: () => held, goodEnough: (r) => goodEnough(r) };

  beforeEach(() => {
    store = new Store();
    grantor = new Grantor();
    secret = FIRST;
    now = Date.now();
    held = undefined;
    goodEnough = () => true;
    credentials = new CredentialsCache(
      () => Promise.resolve(secret),
      HOUR,
      () => now,
    );
    deps = {
      store,
      grantor,
      metrics: metrics(),
      logger: pino({ level: 'silent' }),
      storeGraceMs: 500,
      // No floor unless a test is about it: these tests fetch again at the same instant.
      settings: { minRefreshIntervalMs: 0 },
      now: () => now,
    };
  });

  it('keeps a held token that is still good enough, touching nothing', async () => {
    held = record('held');
    store.down = true;
    await expect(new FleetRefresh(client, deps, credentials).run(ctx)).resolves.toEqual({
      kind: 'token',
      record: held,
      fetched: false,
      unshared: false,
    });
    expect(grantor.calls).toHaveLength(0);
  });

  it('adopts a good stored token without the lock or the provider', async () => {
    const stored = record('stored');
    await store.writeFenced(CLIENT, stored);
    const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
    expect(pass).toMatchObject({ kind: 'token', record: stored, fetched: false });
    expect(store.lockCount).toBe(0);
    expect(grantor.calls).toHaveLength(0);
    expect(await count(deps.metrics.refreshes, 'adopted')).toBe(1);
  });

  it('takes the lock, asks the provider, writes through the fence and releases', async () => {
    const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
    expect(pass).toMatchObject({ kind: 'token', fetched: true, unshared: false });
    const stored = await store.read(CLIENT);
    expect(stored).toMatchObject({ status: 'found', record: { accessToken: 'token-1' } });
    expect([store.lockCount, store.releases]).toEqual([1, 1]);
    expect(await count(deps.metrics.lockAttempts, 'acquired')).toBe(1);
    expect(await count(deps.metrics.refreshes, 'fetched')).toBe(1);
  });

  it('re-reads inside the lock and adopts what the previous holder just wrote', async () => {
    const justWritten = record('previous-holder');
    store.beforeLock = async () => void (await store.writeFenced(CLIENT, justWritten));
    const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
    expect(pass).toMatchObject({ kind: 'token', record: justWritten, fetched: false });
    expect(grantor.calls).toHaveLength(0);
    expect(store.releases).toBe(1);
  });

  it('waits when another replica holds the lock', async () => {
    store.heldElsewhere = true;
    await expect(new FleetRefresh(client, deps, credentials).run(ctx)).resolves.toEqual({
      kind: 'wait',
    });
    expect(grantor.calls).toHaveLength(0);
    expect(await count(deps.metrics.lockAttempts, 'held_elsewhere')).toBe(1);
  });

  it('fetches again when the stored token is not good enough', async () => {
    await store.writeFenced(CLIENT, record('due'));
    goodEnough = (r) => r.accessToken !== 'due';
    const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
    expect(pass).toMatchObject({
      kind: 'token',
      record: { accessToken: 'token-1' },
      fetched: true,
    });
  });

  describe('fleet-wide backoff', () => {
    it('shares a failure with the fleet before releasing the lock; the next holder waits', async () => {
      grantor.failure = new ProviderException(ProviderErrorCode.RateLimited, 'HTTP 429', {
        status: 429,
        retryAfterMs: 2000,
      });
      const failed = jest.fn(() => 2000);
      const pass = await new FleetRefresh(client, deps, credentials).run({ ...ctx, failed });
      expect(pass).toEqual({ kind: 'failed', retryInMs: 2000 });
      expect(failed).toHaveBeenCalledWith(grantor.failure);
      expect(store.releases).toBe(1);
      expect(await store.refreshDeferral(CLIENT)).toBeGreaterThan(1900);
      // Another replica gets the lock: no provider request until the fleet's deferral ends.
      const other = await new FleetRefresh(client, deps, credentials).run({ ...ctx, failed });
      expect(other.kind).toBe('deferred');
      expect(other.kind === 'deferred' && other.retryInMs).toBeGreaterThan(1900);
      expect(grantor.calls).toHaveLength(1);
      expect(failed).toHaveBeenCalledTimes(1);
    });

    it('keeps a failure an operator must fix to this replica (its readiness reports it)', async () => {
      grantor.accepted = SECOND;
      const pass = await new FleetRefresh(client, deps, credentials).run({
        ...ctx,
        failed: () => 1000,
      });
      expect(pass).toEqual({ kind: 'failed', retryInMs: 1000 });
      expect(await store.refreshDeferral(CLIENT)).toBe(0);
    });

    it('never shortens a longer deferral another replica set', async () => {
      await store.deferRefresh(CLIENT, 10_000);
      grantor.failure = new ProviderException(ProviderErrorCode.ServerError, 'HTTP 503');
      const pass = await new FleetRefresh(client, deps, credentials).run({
        ...ctx,
        failed: () => 500,
      });
      expect(pass.kind).toBe('deferred');
      expect(grantor.calls).toHaveLength(0);
      await store.deferRefresh(CLIENT, 0);
      expect(await store.refreshDeferral(CLIENT)).toBeGreaterThan(9_000);
    });

    it('asks the provider again once the deferral is over', async () => {
      const timed = new Store(() => now);
      deps.store = timed;
      await timed.deferRefresh(CLIENT, 1000);
      now += 999;
      expect(
        (await new FleetRefresh(client, deps, credentials).run({ ...ctx, failed: () => 500 })).kind,
      ).toBe('deferred');
      now += 1;
      const pass = await new FleetRefresh(client, deps, credentials).run({
        ...ctx,
        failed: () => 500,
      });
      expect(pass).toMatchObject({ kind: 'token', fetched: true });
    });
  });

  it('releases the lock when the provider fails, and lets the failure through', async () => {
    grantor.failure = new ProviderException(ProviderErrorCode.ServerError, 'HTTP 503');
    await expect(new FleetRefresh(client, deps, credentials).run(ctx)).rejects.toBe(
      grantor.failure,
    );
    expect(store.releases).toBe(1);
  });

  describe('store outage', () => {
    it('waits within the grace period, then fetches on its own, unshared', async () => {
      store.down = true;
      const refresh = new FleetRefresh(client, deps, credentials);
      await expect(refresh.run(ctx)).resolves.toEqual({ kind: 'wait' });
      now += 499;
      await expect(refresh.run(ctx)).resolves.toEqual({ kind: 'wait' });
      now += 1;
      const pass = await refresh.run(ctx);
      expect(pass).toMatchObject({ kind: 'token', fetched: true, unshared: true });
      expect(grantor.calls).toHaveLength(1);
      expect(await count(deps.metrics.lockAttempts, 'error')).toBe(3);
    });

    it('fetches at once when the token served is about to run out', async () => {
      store.down = true;
      held = record('expiring', 900);
      goodEnough = (r) => r !== held;
      const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
      expect(pass).toMatchObject({ kind: 'token', fetched: true, unshared: true });
    });

    it('starts the grace period again once the store answers', async () => {
      store.down = true;
      const refresh = new FleetRefresh(client, deps, credentials);
      await refresh.run(ctx);
      now += 400;
      store.down = false;
      store.heldElsewhere = true;
      await expect(refresh.run(ctx)).resolves.toEqual({ kind: 'wait' });
      store.down = true;
      now += 400;
      await expect(refresh.run(ctx)).resolves.toEqual({ kind: 'wait' });
      expect(grantor.calls).toHaveLength(0);
    });
  });

  describe('refresh floor', () => {
    const FLOOR_MS = 5000;
    let timed: Store;
    beforeEach(() => {
      timed = new Store(() => now);
      deps.store = timed;
      deps.settings = { minRefreshIntervalMs: FLOOR_MS };
      goodEnough = () => false;
    });

    it('no replica asks the provider again until the floor after a grant is over', async () => {
      const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
      expect(pass).toMatchObject({ kind: 'token', fetched: true });
      now += FLOOR_MS - 1;
      // Another replica (its own FleetRefresh) wants a token nobody has good enough.
      const other = await new FleetRefresh(client, deps, credentials).run(ctx);
      expect(other).toEqual({ kind: 'floor', retryInMs: 1, lifetimeMs: HOUR });
      expect(grantor.calls).toHaveLength(1);
      expect(timed.releases).toBe(2);
      now += 1;
      expect(await new FleetRefresh(client, deps, credentials).run(ctx)).toMatchObject({
        fetched: true,
      });
      expect(grantor.calls).toHaveLength(2);
    });

    it('a rejected token does not lift the floor: its replacement waits for it', async () => {
      const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
      expect(pass.kind).toBe('token');
      const first = pass.kind === 'token' ? pass.record : undefined;
      const rule = { caller: 'proxy', floorMs: 0, perCaller: 0, windowMs: 1000 };
      expect(await timed.invalidate(CLIENT, first!.fingerprint, rule)).toBe('invalidated');
      expect(await new FleetRefresh(client, deps, credentials).run(ctx)).toMatchObject({
        kind: 'floor',
      });
      expect(grantor.calls).toHaveLength(1);
      now += FLOOR_MS;
      expect(await new FleetRefresh(client, deps, credentials).run(ctx)).toMatchObject({
        fetched: true,
      });
      expect(grantor.calls).toHaveLength(2);
    });

    it('a token too short-lived to serve is neither stored nor returned, and starts the floor', async () => {
      // Arrives with under 1 s left (the grantor's clock is real time, past the test's `now`).
      grantor.lifetimeMs = 900;
      const pass = await new FleetRefresh(client, deps, credentials).run(ctx);
      expect(pass).toEqual({ kind: 'unusable', lifetimeMs: 900, retryInMs: FLOOR_MS });
      expect(await timed.read(CLIENT)).toEqual({ status: 'absent' });
      // The other replicas learn the provider's lifetime from the floor.
      expect(await timed.refreshHold(CLIENT)).toEqual({ ms: FLOOR_MS, lifetimeMs: 900 });
      expect(timed.releases).toBe(1);
    });

    it('while the store is down, each replica keeps the floor by its own clock', async () => {
      const refresh = new FleetRefresh(client, deps, credentials);
      expect(await refresh.run(ctx)).toMatchObject({ fetched: true });
      timed.down = true;
      now += 1000;
      expect(await refresh.run(ctx)).toEqual({ kind: 'wait' });
      now += 500;
      // Past the store's grace: degraded, but the floor still holds.
      expect(await refresh.run(ctx)).toEqual({ kind: 'floor', retryInMs: FLOOR_MS - 1500 });
      expect(grantor.calls).toHaveLength(1);
      now += FLOOR_MS - 1500;
      expect(await refresh.run(ctx)).toMatchObject({ fetched: true, unshared: true });
      // A rejection lifts it here too.
      refresh.liftLocalFloor();
      expect(await refresh.run(ctx)).toMatchObject({ fetched: true, unshared: true });
      expect(grantor.calls).toHaveLength(3);
    });
  });

  describe('credential rotation', () => {
    it('after invalid_client, re-reads the credentials and retries once with new ones', async () => {
      grantor.accepted = SECOND;
      secret = FIRST;
      const refresh = new FleetRefresh(client, deps, credentials);
      // The cache holds FIRST; the source now holds SECOND.
      await credentials.get();
      secret = SECOND;
      const pass = await refresh.run(ctx);
      expect(pass).toMatchObject({ kind: 'token', fetched: true });
      expect(grantor.calls).toEqual([FIRST, SECOND]);
    });

    it('lets invalid_client through when the source still holds the refused credentials', async () => {
      grantor.accepted = SECOND;
      await expect(new FleetRefresh(client, deps, credentials).run(ctx)).rejects.toMatchObject({
        code: ProviderErrorCode.InvalidClient,
      });
      expect(grantor.calls).toEqual([FIRST]);
    });
  });
});
