// The parser caps every lifetime at this; a stored token claiming more was not written by us.
import { MAX_LIFETIME_SECONDS } from '../provider/token-response.parser';
import type { TokenCipher } from '../token/token-cipher';
import { fingerprintOf, type TokenRecord, withGeneration } from '../token/token-record';
import type { StoredToken, TokenRecords, TokenStoreEvent } from '../token/token-store';
import type { RedisFleetBus } from './fleet-bus.redis';
import { redisKeys } from './redis.constants';
import type { RedisStoreHealth } from './store-health.redis';

/** The longest lifetime a token we wrote can have, in ms. */
const MAX_LIFETIME_MS = MAX_LIFETIME_SECONDS * 1000;
/** Slack before a stored expiry counts as corrupt (all times are Redis's: no skew to allow). */
const FENCE_SLACK_MS = 60_000;

/**
 * The token records on Redis: a hash per client (`exp`, `obt` on Redis's clock and `fp` in clear
 * for the fence, `wexp` the writer's own expiry as a hint, `val` sealed by the
 * {@link TokenCipher}), and a pub/sub channel per client to wake the other replicas.
 */
export class RedisTokenRecords implements TokenRecords {
  private readonly listeners: Array<(e: TokenStoreEvent) => void> = [];
  private readonly lastCorrupt = new Map<string, string>();

  constructor(
    private readonly health: RedisStoreHealth,
    private readonly bus: RedisFleetBus,
    private readonly cipher: TokenCipher,
  ) {}

  onEvent(listener: (event: TokenStoreEvent) => void): void {
    this.listeners.push(listener);
  }

  async read(clientId: string): Promise<StoredToken> {
    const sentAt = this.health.now();
    const fields = await this.health.run(() =>
      this.health.redis.tbRead(redisKeys.token(clientId), redisKeys.generation(clientId)),
    );
    const arrivedAt = this.health.now();
    const [exp, obt, fp, val, inv, writerExp, redisNowText, generationText] = fields;
    const generation = this.bus.learnGeneration(clientId, Number(generationText ?? fields[1]));
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
    const lifetimeMs = expRedis - obtRedis;
    const accessToken = this.openValue(clientId, val, fp, lifetimeMs, writerExp, generation);
    if (accessToken === undefined) return this.corrupt(clientId, val);
    const offset = this.health.clock.observe(sentAt, arrivedAt, redisNow);
    const expiresAt = checkedExpiry(expRedis, offset, writerExp);
    if (expiresAt === undefined) return this.corrupt(clientId, val);
    const record = withGeneration(
      {
        accessToken,
        expiresAt,
        obtainedAt: expiresAt - lifetimeMs,
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
    const remainingMs = record.expiresAt - this.health.now();
    const [written, generation] = await this.health.run(() =>
      this.health.redis.tbWriteFenced(
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
    this.bus.learnGeneration(clientId, Number(generation));
    return written === 1;
  }

  async invalidate(clientId: string, fingerprint: string): Promise<boolean> {
    const done = await this.health.run(() =>
      this.health.redis.tbInvalidate(
        redisKeys.token(clientId),
        redisKeys.floor(clientId),
        fingerprint,
        redisKeys.events(clientId),
      ),
    );
    return done === 1;
  }

  async discardCorrupt(clientId: string): Promise<void> {
    const seen = this.lastCorrupt.get(clientId) ?? '';
    await this.health.run(() =>
      this.health.redis.tbDiscardCorrupt(
        redisKeys.token(clientId),
        redisKeys.floor(clientId),
        seen,
      ),
    );
    this.lastCorrupt.delete(clientId);
  }

  /** The access token in a stored value; undefined when it fails to open or is another's. */
  private openValue(
    clientId: string,
    val: string,
    fp: string,
    lifetimeMs: number,
    writerExp: string | null | undefined,
    generation: number,
  ): string | undefined {
    let accessToken: string;
    try {
      // The clear fields are authenticated with the value: an edited fingerprint, lifetime or
      // writer's expiry (to pin an old token's expiry, say) fails to open. So is the highest
      // revocation generation this replica has seen: a value put back after a revoke fails
      // too, even with the generation key reset as well.
      accessToken = this.cipher.open(
        clientId,
        val,
        recordContext(fp, lifetimeMs, writerExp ?? ''),
        generation,
      );
    } catch {
      return undefined;
    }
    // The fingerprint is in clear for the fence; it must be this token's.
    if (fingerprintOf(accessToken) !== fp) return undefined;
    return accessToken;
  }

  private corrupt(clientId: string, val: string): StoredToken {
    this.lastCorrupt.set(clientId, val);
    return { status: 'corrupt' };
  }

  /** Turns a message heard on the client's channel into an event for the listeners. */
  deliver(clientId: string, message: string): void {
    let event: TokenStoreEvent | undefined;
    if (message.startsWith('u:')) {
      event = { type: 'updated', clientId, fingerprint: message.slice(2) };
    } else if (message.startsWith('i:')) {
      event = { type: 'invalidated', clientId, fingerprint: message.slice(2) };
    } else if (message.startsWith('r:')) {
      // r:<generation>:<fingerprint or empty>
      const [generationText = '', fingerprint = ''] = message.slice(2).split(':');
      const generation = this.bus.learnGeneration(clientId, Number(generationText));
      event = {
        type: 'revoked',
        clientId,
        generation,
        fingerprint: fingerprint === '' ? undefined : fingerprint,
      };
    }
    if (event) for (const l of this.listeners) l(event);
  }
}

/**
 * How far a stored expiry (Redis time, converted) may lie beyond the writer's own authenticated
 * expiry before the record counts as tampered: more than any wall-clock skew the fleet is meant
 * to tolerate (replicas 30 s off are tested), far less than a token's lifetime.
 */
const MAX_WRITER_SKEW_MS = 5 * 60_000;

/**
 * A stored token's expiry in this replica's clock (see {@link localExpiry}); undefined when
 * Redis's `exp` lies too far beyond the writer's own expiry.
 */
function checkedExpiry(
  expRedis: number,
  offset: { upper: number; lower: number },
  writerExp: string | null | undefined,
): number | undefined {
  const writerExpiresAt = Number(writerExp);
  // Redis's `exp` is not authenticated (Redis computes it); the writer's expiry is. A stored
  // `exp` moved later than the writer's expiry plus any believable clock skew is refused.
  if (
    Number.isFinite(writerExpiresAt) &&
    localExpiry(expRedis, offset, writerExpiresAt) > writerExpiresAt + MAX_WRITER_SKEW_MS
  ) {
    return undefined;
  }
  return localExpiry(expRedis, offset, writerExpiresAt);
}

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
