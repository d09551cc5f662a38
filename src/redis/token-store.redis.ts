import { randomUUID } from 'node:crypto';
import { ExecutionError, Redlock, ResourceLockedError } from '@sesamecare-oss/redlock';
import type { Logger } from 'pino';
import type { RedisSettings } from '../config/config.schema';
// The parser caps every lifetime at this; a stored token claiming more was not written by us.
import { MAX_LIFETIME_SECONDS } from '../provider/token-response.parser';
import type { TokenCipher } from '../token/token-cipher';
import { fingerprintOf, type TokenRecord, withGeneration } from '../token/token-record';
import {
  type LockState,
  type RefreshHold,
  type Locked,
  REPLICA_ID,
  type Revocation,
  type StoreContinuity,
  type StoredToken,
  type StoreTopology,
  type TokenStore,
  type TokenStoreEvent,
} from '../token/token-store';
import { TokenStoreErrorCode, TokenStoreException } from '../token/token-store.exception';
import { RedisClockOffset } from './redis-clock';
import { defineTokenStoreScripts, type RedisWithScripts } from './token-store.lua';
import { redisKeys } from './redis.constants';
import { closeRedisClient, type RedisClient, takeEarlyError } from './redis.connection';
import { type RedisState, RedisStateTracker, type StateLogger } from './redis-state';

/** The longest lifetime a token we wrote can have, in ms. */
const MAX_LIFETIME_MS = MAX_LIFETIME_SECONDS * 1000;
/** Slack before a stored expiry counts as corrupt (all times are Redis's: no skew to allow). */
const FENCE_SLACK_MS = 60_000;

const SILENT: StateLogger = {
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
};

/**
 * The shared token store on Redis: a hash per client (`exp`, `obt` on Redis's clock and `fp`
 * in clear for the fence, `wexp` the writer's own expiry as a hint, `val` sealed by the
 * {@link TokenCipher}), a redlock lease for the refresher, a pub/sub channel per client to wake
 * the other replicas, the fleet's refresh deferral and a continuity marker.
 *
 * No replica's wall clock decides anything here: replicas send and receive durations, and every
 * absolute time is Redis's (`TIME` inside the scripts).
 */
export class RedisTokenStore implements TokenStore {
  readonly kind = 'redis' as const;
  private readonly redis: RedisWithScripts;
  private readonly redlock: Redlock;
  private readonly listeners: Array<(e: TokenStoreEvent) => void> = [];
  private readonly recoveredListeners: Array<() => void> = [];
  private readonly reloadListeners: Array<(from: string) => void> = [];
  private readonly lastCorrupt = new Map<string, string>();
  /** The highest revocation generation this replica saw per client (see {@link generation}). */
  private readonly generations = new Map<string, number>();
  /** The last epoch this replica saw per client (see {@link checkContinuity}). */
  private readonly epochs = new Map<string, { id: string; seq: number }>();
  /**
   * This replica's wall clock (epoch ms). Only durations taken on it reach Redis, so an offset
   * cancels out; tests replace it to play a skewed replica.
   */
  now: () => number = Date.now;
  /** Bounds on Redis's clock against this replica's, from recent round trips. */
  private readonly clock = new RedisClockOffset();
  private pingTimer?: NodeJS.Timeout;
  private readonly tracker: RedisStateTracker;
  private readonly probeClient: string;
  private closing = false;

  /**
   * @param logger receives one line per state transition (up, down, misconfigured); omitted
   *   in tests that do not look at logs.
   */
  constructor(
    redis: RedisClient,
    private readonly subscriber: RedisClient,
    private readonly cipher: TokenCipher,
    private readonly settings: RedisSettings,
    private readonly lockTtlMs: number,
    clientIds: readonly string[],
    logger: StateLogger | Logger = SILENT,
  ) {
    this.tracker = new RedisStateTracker(logger, describeRedis(settings));
    this.probeClient = clientIds[0] ?? 'probe';
    this.redis = defineTokenStoreScripts(redis);
    // One attempt, no retries: a held lock means another replica is refreshing, and waiting
    // for its pub/sub message beats polling the lock. `using` extends the lease when a third of
    // it is left, or four command timeouts if less: it retries a failed extension at once until
    // the lease ends, which busies the event loop while Redis refuses at once, so keep it short.
    this.redlock = new Redlock([redis], {
      retryCount: 0,
      automaticExtensionThreshold: Math.min(
        Math.floor(lockTtlMs / 3),
        4 * settings.commandTimeoutMs,
      ),
    });
    this.redlock.on('error', () => undefined);

    const channels = new Map(clientIds.map((id) => [redisKeys.events(id), id]));
    subscriber.on('message', (channel: string, message: string) => {
      if (channel === redisKeys.reloadChannel) {
        for (const l of this.reloadListeners) l(message);
        return;
      }
      const clientId = channels.get(channel);
      if (clientId !== undefined) this.dispatch(clientId, message);
    });
    // Connection errors carry the real cause (WRONGPASS, a TLS code, ECONNREFUSED) that the
    // failing commands do not; an unhandled 'error' event would also crash the process.
    const onConnectionError = (err: unknown) => this.tracker.failed(err, true);
    for (const client of [redis, subscriber]) {
      client.on('error', onConnectionError);
      // A Cluster reports its nodes' errors separately from its own.
      client.on('node error', onConnectionError);
      // One reported before this store existed (see createRedisConnection).
      const early = takeEarlyError(client);
      if (early !== undefined) onConnectionError(early);
    }
    // Every reconnection counts as a recovery, even when no command failed in between (a blip
    // shorter than the ping interval): Redis may have restarted empty, and the replicas must
    // push their token back into it.
    // A closed connection is a (maybe short) outage: the next success logs the way back and
    // runs the recovery listeners. A demoted master's READONLY closes it too, on purpose.
    redis.on('close', () => {
      if (!this.closing) this.tracker.failed(new Error('connection to Redis closed'));
    });
    redis.on('ready', () => void this.ping());
    // A resubscribed subscriber missed what was published while it was away: re-read, as after
    // an outage, rather than wait for the next refresh to notice a newer token.
    let subscribedBefore = false;
    subscriber.on('ready', () => {
      if (subscribedBefore) for (const l of this.recoveredListeners) l();
      subscribedBefore = true;
    });
    void subscriber.subscribe(...channels.keys(), redisKeys.reloadChannel).catch(() => undefined);
    this.pingTimer = setInterval(() => void this.ping(), settings.pingIntervalMs);
    this.pingTimer.unref();
  }

  get healthy(): boolean {
    return this.tracker.state === 'up';
  }

  /** `up`, `down` (an outage) or `misconfigured` (see {@link configurationError}). */
  get state(): RedisState {
    return this.tracker.state;
  }

  /**
   * Why Redis refuses the broker (authentication, ACL, TLS trust), while it does: a setting to
   * fix, not an outage to wait out. `undefined` otherwise.
   */
  get configurationError(): string | undefined {
    return this.tracker.problem?.message;
  }

  onEvent(listener: (event: TokenStoreEvent) => void): void {
    this.listeners.push(listener);
  }

  onRecovered(listener: () => void): void {
    this.recoveredListeners.push(listener);
  }

  async requestReload(): Promise<number> {
    return this.run(() => this.redis.publish(redisKeys.reloadChannel, REPLICA_ID));
  }

  onReloadRequested(listener: (from: string) => void): void {
    this.reloadListeners.push(listener);
  }

  async read(clientId: string): Promise<StoredToken> {
    const sentAt = this.now();
    const fields = await this.run(() =>
      this.redis.tbRead(redisKeys.token(clientId), redisKeys.generation(clientId)),
    );
    const arrivedAt = this.now();
    const [exp, obt, fp, val, inv, writerExp, redisNowText, generationText] = fields;
    const generation = this.learnGeneration(clientId, Number(generationText ?? fields[1]));
    // Redis answered: it is up, but the key holds something else than our hash.
    if (exp === 'wrongtype' && fields.length === 2) return this.corrupt(clientId, '');
    if (exp === null && val === null && inv === null) return { status: 'absent' };
    // Invalidated (the value is gone, the expiry stays as a fence), unless the marker is junk.
    if (inv !== null && Number.isFinite(Number(inv))) return { status: 'absent' };
    const expRedis = Number(exp);
    const obtRedis = Number(obt);
    const redisNow = Number(redisNowText);
    if (
      !Number.isFinite(expRedis) ||
      !Number.isFinite(obtRedis) ||
      !fp ||
      !val ||
      inv !== null ||
      // Lifetimes we store are positive and capped: anything else was not written by a broker.
      expRedis <= obtRedis ||
      expRedis - obtRedis > MAX_LIFETIME_MS ||
      expRedis - redisNow > MAX_LIFETIME_MS + FENCE_SLACK_MS
    ) {
      return this.corrupt(clientId, val ?? '');
    }
    // Expired in Redis time (the key outlived it by less than its own expiry granularity).
    if (expRedis <= redisNow) return { status: 'absent' };
    let accessToken: string;
    try {
      // The clear fields are authenticated with the value: an edited fingerprint, lifetime or
      // writer's expiry (to pin an old token's expiry, say) fails to open. So is the highest
      // revocation generation this replica has seen: a value put back after a revoke fails
      // too, even with the generation key reset as well.
      accessToken = this.cipher.open(
        clientId,
        val,
        recordContext(fp, expRedis - obtRedis, writerExp ?? ''),
        generation,
      );
    } catch {
      return this.corrupt(clientId, val);
    }
    // The fingerprint is in clear for the fence; it must be this token's.
    if (fingerprintOf(accessToken) !== fp) return this.corrupt(clientId, val);
    const offset = this.clock.observe(sentAt, arrivedAt, redisNow);
    const writerExpiresAt = Number(writerExp);
    // Redis's `exp` is not authenticated (Redis computes it); the writer's expiry is. A stored
    // `exp` moved later than the writer's expiry plus any believable clock skew is refused.
    if (
      Number.isFinite(writerExpiresAt) &&
      localExpiry(expRedis, offset, writerExpiresAt) > writerExpiresAt + MAX_WRITER_SKEW_MS
    ) {
      return this.corrupt(clientId, val);
    }
    const expiresAt = localExpiry(expRedis, offset, writerExpiresAt);
    const record = withGeneration(
      {
        accessToken,
        expiresAt,
        obtainedAt: expiresAt - (expRedis - obtRedis),
        fingerprint: fp,
      },
      generation,
    );
    return { status: 'found', record };
  }

  async writeFenced(clientId: string, record: TokenRecord): Promise<boolean> {
    // Whole ms: Redis stores `obt` as `exp` minus this, and the reader authenticates the
    // difference it reads back.
    const lifetimeMs = Math.round(record.expiresAt - record.obtainedAt);
    const writerExpiresAt = String(record.expiresAt);
    const sealed = this.cipher.seal(
      clientId,
      record.accessToken,
      recordContext(record.fingerprint, lifetimeMs, writerExpiresAt),
      // The generation it was requested in: the fenced write stores it only if that is the
      // store's generation (or raises the store's to it), which is what readers open it with.
      record.generation ?? 0,
    );
    // Durations from this replica's clock: whatever its offset, it cancels out here.
    const remainingMs = record.expiresAt - this.now();
    const [written, generation] = await this.run(() =>
      this.redis.tbWriteFenced(
        redisKeys.token(clientId),
        redisKeys.generation(clientId),
        remainingMs,
        lifetimeMs,
        record.fingerprint,
        sealed,
        redisKeys.events(clientId),
        MAX_LIFETIME_MS + FENCE_SLACK_MS,
        writerExpiresAt,
        record.generation ?? 0,
      ),
    );
    this.learnGeneration(clientId, Number(generation));
    return written === 1;
  }

  // ---- Admin: revocation generations, lock holder, topology (issue #16) --------------------

  async revoke(clientId: string): Promise<Revocation> {
    const [generation, fingerprint, delivered] = await this.run(() =>
      this.redis.tbRevoke(
        redisKeys.token(clientId),
        redisKeys.floor(clientId),
        redisKeys.generation(clientId),
        redisKeys.events(clientId),
      ),
    );
    this.learnGeneration(clientId, Number(generation));
    return {
      generation: Number(generation),
      fingerprint: fingerprint === '' ? undefined : fingerprint,
      delivered: Number(delivered),
    };
  }

  generation(clientId: string): number {
    return this.generations.get(clientId) ?? 0;
  }

  async acknowledgeRevocation(clientId: string, generation: number): Promise<void> {
    const key = redisKeys.revocationAcks(clientId, generation);
    await this.run(() => this.redis.tbAcknowledge(key, REPLICA_ID, REVOCATION_ACKS_TTL_MS));
  }

  async revocationAcks(clientId: string, generation: number): Promise<number> {
    return this.run(() => this.redis.scard(redisKeys.revocationAcks(clientId, generation)));
  }

  async lockState(clientId: string): Promise<LockState> {
    const [ttl, holder] = await this.run(() =>
      Promise.all([
        this.redis.pttl(redisKeys.lock(clientId)),
        this.redis.get(redisKeys.lockHolder(clientId)),
      ]),
    );
    return ttl > 0 ? { held: true, holder: holder ?? undefined, ttlMs: ttl } : { held: false };
  }

  topology(): StoreTopology {
    return { kind: 'redis', ...describeTopology(this.settings), state: this.tracker.state };
  }

  /** Keeps the highest generation seen for `clientId`, and returns it. */
  private learnGeneration(clientId: string, generation: number): number {
    const known = this.generations.get(clientId) ?? 0;
    if (Number.isSafeInteger(generation) && generation > known) {
      this.generations.set(clientId, generation);
      return generation;
    }
    return known;
  }

  async invalidate(clientId: string, fingerprint: string): Promise<boolean> {
    const done = await this.run(() =>
      this.redis.tbInvalidate(
        redisKeys.token(clientId),
        redisKeys.floor(clientId),
        fingerprint,
        redisKeys.events(clientId),
      ),
    );
    return done === 1;
  }

  async deferRefresh(clientId: string, delayMs: number): Promise<number> {
    return this.run(() =>
      this.redis.tbDeferRefresh(redisKeys.backoff(clientId), Math.max(0, Math.ceil(delayMs))),
    );
  }

  async refreshDeferral(clientId: string): Promise<number> {
    // PTTL is -2 (no key) or -1 (no expiry, never set by us): both mean "not deferred".
    const left = await this.run(() => this.redis.pttl(redisKeys.backoff(clientId)));
    return Math.max(0, left);
  }

  async holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void> {
    await this.run(() =>
      this.redis.set(
        redisKeys.floor(clientId),
        String(Math.max(0, Math.round(lifetimeMs))),
        'PX',
        Math.max(1, Math.ceil(intervalMs)),
      ),
    );
  }

  async refreshHold(clientId: string): Promise<RefreshHold> {
    const [left, value] = await this.run(() => this.redis.tbRefreshHold(redisKeys.floor(clientId)));
    // PTTL is -2 (no key) or -1 (no expiry, never set by us): both mean "no floor".
    if (!(left > 0)) return { ms: 0 };
    const lifetimeMs = Number(value);
    // Anything but a plain number (written by hand, foreign) names no lifetime.
    return Number.isSafeInteger(lifetimeMs) && lifetimeMs > 0
      ? { ms: left, lifetimeMs }
      : { ms: left };
  }

  async checkContinuity(clientId: string): Promise<StoreContinuity> {
    const sentAt = this.now();
    const [id, seq, redisNow] = await this.run(() =>
      this.redis.tbEpochAdvance(redisKeys.epoch(clientId), randomUUID()),
    );
    this.clock.observe(sentAt, this.now(), Number(redisNow));
    const seen = this.epochs.get(clientId);
    this.epochs.set(clientId, { id, seq: Number(seq) });
    if (seen === undefined) return 'first';
    if (seen.id !== id) return 'lost';
    return Number(seq) > seen.seq ? 'kept' : 'rolled_back';
  }

  async discardCorrupt(clientId: string): Promise<void> {
    const seen = this.lastCorrupt.get(clientId) ?? '';
    await this.run(() =>
      this.redis.tbDiscardCorrupt(redisKeys.token(clientId), redisKeys.floor(clientId), seen),
    );
    this.lastCorrupt.delete(clientId);
  }

  async withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>> {
    // Settled inside the routine: redlock's release error must neither hide nor replace it.
    let ran: { value: T } | { error: unknown } | undefined;
    try {
      // `using` extends the lease while `fn` runs, so a slow refresh keeps it; a dead holder's
      // lease runs out after lockTtlMs and another replica takes over. A lease lost anyway
      // does not stop `fn`: the lock is an efficiency lock, the fenced write is the guarantee.
      await this.redlock.using([redisKeys.lock(clientId)], this.lockTtlMs, async () => {
        this.markHealthy();
        // Who holds it, for the admin status (shown only while the lock key exists).
        this.redis.set(redisKeys.lockHolder(clientId), REPLICA_ID).catch(() => undefined);
        try {
          ran = { value: await fn() };
        } catch (error) {
          ran = { error };
        }
      });
    } catch (cause) {
      // Only a failed release after `fn` ran: the lease runs out on its own.
      if (ran === undefined) {
        if (await isHeldElsewhere(cause)) return { acquired: false };
        throw this.unavailable(cause, 'acquiring the refresh lock');
      }
    }
    const settled = ran as { value: T } | { error: unknown };
    if ('error' in settled) throw settled.error;
    return { acquired: true, value: settled.value };
  }

  async waitUntilReady(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      await this.ping();
      if (this.healthy) return true;
      // A configuration error will not pass within the wait: start now, not ready, and say why.
      if (this.tracker.state === 'misconfigured') return false;
      await new Promise((r) => setTimeout(r, 50));
    }
    return this.healthy;
  }

  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.pingTimer);
    await Promise.all([closeRedisClient(this.subscriber), closeRedisClient(this.redis)]);
  }

  private corrupt(clientId: string, val: string): StoredToken {
    this.lastCorrupt.set(clientId, val);
    return { status: 'corrupt' };
  }

  private dispatch(clientId: string, message: string): void {
    let event: TokenStoreEvent | undefined;
    if (message.startsWith('u:')) {
      event = { type: 'updated', clientId, fingerprint: message.slice(2) };
    } else if (message.startsWith('i:')) {
      event = { type: 'invalidated', clientId, fingerprint: message.slice(2) };
    } else if (message.startsWith('r:')) {
      // r:<generation>:<fingerprint or empty>
      const [generationText = '', fingerprint = ''] = message.slice(2).split(':');
      const generation = this.learnGeneration(clientId, Number(generationText));
      event = {
        type: 'revoked',
        clientId,
        generation,
        fingerprint: fingerprint === '' ? undefined : fingerprint,
      };
    }
    if (event) for (const l of this.listeners) l(event);
  }

  private async ping(): Promise<void> {
    try {
      await this.run(
        () =>
          this.redis.tbProbe(
            redisKeys.token(this.probeClient),
            `tb:{${this.probeClient}}:probe-never-exists`,
            `tb:{${this.probeClient}}:probe`,
          ),
        true,
      );
    } catch {
      // `run` already marked the store unhealthy.
    }
  }

  /**
   * Runs one command, tracking the Redis state. `probe`: the health probe, the only success
   * that clears an ACL problem (a plain read succeeding says nothing about the scripts).
   */
  private async run<T>(command: () => Promise<T>, probe = false): Promise<T> {
    try {
      const result = await command();
      this.markHealthy(probe);
      return result;
    } catch (cause) {
      throw this.unavailable(cause, 'a Redis command');
    }
  }

  private markHealthy(probe = false): void {
    if (!this.tracker.succeeded(probe)) return;
    for (const l of this.recoveredListeners) l();
  }

  private unavailable(cause: unknown, what: string): TokenStoreException {
    this.tracker.failed(cause);
    const problem = this.tracker.problem;
    const reason = cause instanceof Error ? cause.message : 'unknown error';
    return new TokenStoreException(
      TokenStoreErrorCode.Unavailable,
      problem
        ? `Redis failed during ${what}: ${problem.message}`
        : `Redis failed during ${what} (${reason}); serving from memory until it returns. Check the Redis settings (REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES) and the Redis server; see "commandTimeoutMs" for how long a command may take`,
      { cause },
    );
  }
}

/**
 * How far a stored expiry (Redis time, converted) may lie beyond the writer's own authenticated
 * expiry before the record counts as tampered: more than any wall-clock skew the fleet is meant
 * to tolerate (replicas 30 s off are tested), far less than a token's lifetime.
 */
const MAX_WRITER_SKEW_MS = 5 * 60_000;

/** What a sealed value authenticates besides the client id: the fields kept in clear. */
function recordContext(fingerprint: string, lifetimeMs: number, writerExpiresAt: string): string {
  return `fp=${fingerprint};life=${lifetimeMs};wexp=${writerExpiresAt}`;
}

/** Millisecond granularity of the two clocks compared (Redis's TIME, the replica's Date.now). */
const CLOCK_GRAIN_MS = 2;

/**
 * How far below the measured range the writer's hint is still taken. Redis anchors the writer's
 * duration when the script runs, a write's latency after the writer read its clock, so the
 * stored expiry can claim that much too much; a writer whose clock agrees with ours knows the
 * exact figure, and a hint a little too early only under-claims (always safe).
 */
const HINT_BELOW_MS = 500;

/**
 * A stored token's expiry in this replica's clock, from its expiry in Redis time and the bounds
 * of Redis's clock offset (see {@link RedisClockOffset}).
 *
 * The true local expiry lies in `[expRedis − upper, expRedis − lower]`; the conservative answer
 * is its start. The writer's own figure (`writerExpiresAt`) is only a hint: used when it lies
 * inside that range (or up to {@link HINT_BELOW_MS} before it: earlier is safe), where nothing
 * this replica measured can tell it from the truth, so replicas whose clocks agree keep the exact
 * same expiry. A writer whose clock is off lands
 * outside the range and is ignored.
 */
export function localExpiry(
  expRedis: number,
  offset: { upper: number; lower: number },
  writerExpiresAt: number,
): number {
  const earliest = expRedis - offset.upper;
  const latest = expRedis - offset.lower;
  if (
    Number.isFinite(writerExpiresAt) &&
    writerExpiresAt >= earliest - HINT_BELOW_MS &&
    writerExpiresAt <= latest + CLOCK_GRAIN_MS
  ) {
    return writerExpiresAt;
  }
  return earliest;
}

/** True when redlock failed only because another holder has the lock. */
async function isHeldElsewhere(cause: unknown): Promise<boolean> {
  if (!(cause instanceof ExecutionError)) return false;
  const stats = await Promise.all(cause.attempts);
  const errors = stats.flatMap((s) => [...s.votesAgainst.values()]);
  return errors.length > 0 && errors.every((e) => e instanceof ResourceLockedError);
}

/** How long a revocation's acknowledgements are kept (the admin answer reads them at once). */
const REVOCATION_ACKS_TTL_MS = 10 * 60_000;

/** Mode and node addresses for the admin status: host and port only, never a password. */
function describeTopology(settings: RedisSettings): { mode: string; nodes: string[] } {
  switch (settings.mode) {
    case 'standalone':
      return {
        mode: 'standalone',
        nodes: URL.canParse(settings.url ?? '') ? [new URL(settings.url!).host] : [],
      };
    case 'sentinel':
      return { mode: 'sentinel', nodes: [...(settings.sentinel.nodes ?? [])] };
    case 'cluster':
      return { mode: 'cluster', nodes: [...(settings.cluster.nodes ?? [])] };
  }
}

/** How the transition log names the Redis in use: the mode and its addresses, never a password. */
function describeRedis(settings: RedisSettings): string {
  switch (settings.mode) {
    case 'standalone':
      // Only scheme and host: the URL may carry a password.
      return URL.canParse(settings.url ?? '')
        ? `standalone ${new URL(settings.url!).protocol}//${new URL(settings.url!).host}`
        : 'standalone';
    case 'sentinel':
      return `sentinel ${settings.sentinel.masterName ?? ''} via ${(settings.sentinel.nodes ?? []).join(',')}`;
    case 'cluster':
      return `cluster via ${(settings.cluster.nodes ?? []).join(',')}`;
  }
}
