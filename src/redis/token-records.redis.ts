import { ReplyError } from 'ioredis';
// The parser caps every lifetime at this; a stored token claiming more was not written by us.
import { MAX_LIFETIME_SECONDS } from '../provider/token-response.parser';
import type { TokenCipher } from '../token/token-cipher';
import { fingerprintOf, type TokenRecord, withGeneration } from '../token/token-record';
import type {
  RejectionRule,
  RejectionVerdict,
  StoredToken,
  TokenRecords,
  TokenStoreEvent,
} from '../token/token-store';
import type { RedisFleetBus } from './fleet-bus.redis';
import { redisKeys } from './redis.constants';
import type { RedisStoreHealth } from './store-health.redis';

const MAX_LIFETIME_MS = MAX_LIFETIME_SECONDS * 1000;
/** Clients per {@link RedisTokenRecords.readMany} script: bounds one reply (~1 KiB a client). */
export const READ_MANY_CHUNK = 500;
/** All times are Redis's: no skew to allow. */
const FENCE_SLACK_MS = 60_000;
/** What the invalidation script answered. */
const VERDICTS = new Map<number, RejectionVerdict>([
  [1, 'invalidated'],
  [0, 'stale'],
  [-1, 'floored'],
  [-2, 'caller_budget'],
]);

/**
 * A hash per client (`exp`, `obt` in Redis time and `fp` in clear for the fence, `wexp` the
 * writer's expiry as a hint, `val` sealed) and a pub/sub channel to wake the other replicas.
 */
export class RedisTokenRecords implements TokenRecords {
  private readonly listeners: Array<(e: TokenStoreEvent) => void> = [];
  private readonly lastCorrupt = new Map<string, string>();
  /** Each followed client by its channel. */
  private channels: ReadonlyMap<string, string>;

  constructor(
    private readonly health: RedisStoreHealth,
    private readonly bus: RedisFleetBus,
    private readonly cipher: TokenCipher,
    clientIds: readonly string[],
  ) {
    this.channels = new Map(clientIds.map((id) => [redisKeys.events(id), id]));
  }

  onEvent(listener: (event: TokenStoreEvent) => void): void {
    this.listeners.push(listener);
  }

  /** A message on a channel no longer followed is dropped (an unsubscription in flight). */
  clientOf(channel: string): string | undefined {
    return this.channels.get(channel);
  }

  async follow(clientIds: readonly string[]): Promise<void> {
    this.channels = new Map(clientIds.map((id) => [redisKeys.events(id), id]));
    await this.health.follow([...this.channels.keys(), redisKeys.reloadChannel]);
  }

  async read(clientId: string): Promise<StoredToken> {
    const sentAt = this.health.now();
    const fields = await this.health.run((redis) =>
      redis.tbRead(redisKeys.token(clientId), redisKeys.generation(clientId)),
    );
    return this.decode(clientId, fields, sentAt, this.health.now());
  }

  /**
   * One script per node and {@link READ_MANY_CHUNK} clients, the nodes asked at once: a replica
   * that joins reads a thousand clients in a round trip or two, not one each. A chunk the node
   * refuses as a whole (a Redis before 7 knows no script flags; a slot moving during a
   * resharding) is read client by client, pipelined.
   */
  async readMany(clientIds: readonly string[]): Promise<ReadonlyMap<string, StoredToken>> {
    const found = new Map<string, StoredToken>();
    const chunks = [...this.health.byNode(clientIds).values()].flatMap((ids) => chunked(ids));
    await Promise.all(
      chunks.map(async (ids) => {
        const keys = ids.flatMap((id) => [redisKeys.token(id), redisKeys.generation(id)]);
        const sentAt = this.health.now();
        let replies: (string | null)[][];
        try {
          replies = await this.health.redis.tbReadMany(keys[0], ...keys);
          this.health.markHealthy();
        } catch (err) {
          // Redis answered, refusing this script only: not an outage.
          if (!(err instanceof ReplyError)) throw this.health.unavailable(err, 'a Redis command');
          replies = await this.readEach(ids);
        }
        const arrivedAt = this.health.now();
        ids.forEach((id, i) => found.set(id, this.decode(id, replies[i], sentAt, arrivedAt)));
      }),
    );
    return found;
  }

  /** {@link read}'s command for each of `ids`, in one pipeline (a Cluster splits it by node). */
  private readEach(ids: readonly string[]): Promise<(string | null)[][]> {
    return this.health.run((redis) =>
      Promise.all(ids.map((id) => redis.tbRead(redisKeys.token(id), redisKeys.generation(id)))),
    );
  }

  private decode(
    clientId: string,
    fields: (string | null)[],
    sentAt: number,
    arrivedAt: number,
  ): StoredToken {
    const [exp, obt, fp, val, inv, writerExp, redisNowText, generationText, typ] = fields;
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
    // Only DPoP is written; anything else is not a broker's.
    if (typ !== null && typ !== undefined && typ !== 'DPoP') return this.corrupt(clientId, val);
    const tokenType = typ === 'DPoP' ? ('DPoP' as const) : undefined;
    const accessToken = this.openValue(
      clientId,
      val,
      fp,
      lifetimeMs,
      writerExp,
      generation,
      tokenType,
    );
    if (accessToken === undefined) return this.corrupt(clientId, val);
    const offset = this.health.clock.observe(sentAt, arrivedAt, redisNow);
    const expiresAt = checkedExpiry(expRedis, offset, writerExp);
    if (expiresAt === undefined) return this.corrupt(clientId, val);
    const record = {
      accessToken,
      expiresAt,
      obtainedAt: expiresAt - lifetimeMs,
      fingerprint: fp,
      ...(tokenType !== undefined && { tokenType }),
    };
    return { status: 'found', record: withGeneration(record, generation) };
  }

  async writeFenced(clientId: string, record: TokenRecord): Promise<boolean> {
    // Whole ms: the reader authenticates the difference it reads back.
    const lifetimeMs = Math.round(record.expiresAt - record.obtainedAt);
    const writerExpiresAt = String(record.expiresAt);
    const sealed = this.cipher.seal(
      clientId,
      record.accessToken,
      recordContext(record.fingerprint, lifetimeMs, writerExpiresAt, record.tokenType),
      record.generation ?? 0,
    );
    // Durations from this replica's clock: whatever its offset, it cancels out here.
    const remainingMs = record.expiresAt - this.health.now();
    const [written, generation] = await this.health.run((redis) =>
      redis.tbWriteFenced(
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
        record.tokenType ?? '',
      ),
    );
    this.bus.learnGeneration(clientId, Number(generation));
    return written === 1;
  }

  async invalidate(
    clientId: string,
    fingerprint: string,
    rule: RejectionRule,
  ): Promise<RejectionVerdict> {
    const done = await this.health.run((redis) =>
      redis.tbInvalidate(
        redisKeys.token(clientId),
        redisKeys.rejectionFloor(clientId),
        redisKeys.callerRejections(clientId, rule.caller),
        fingerprint,
        redisKeys.events(clientId),
        rule.floorMs,
        rule.perCaller,
        rule.windowMs,
      ),
    );
    return VERDICTS.get(Number(done)) ?? 'stale';
  }

  async discardCorrupt(clientId: string): Promise<void> {
    const seen = this.lastCorrupt.get(clientId) ?? '';
    await this.health.run((redis) =>
      redis.tbDiscardCorrupt(redisKeys.token(clientId), redisKeys.floor(clientId), seen),
    );
    this.lastCorrupt.delete(clientId);
  }

  private openValue(
    clientId: string,
    val: string,
    fp: string,
    lifetimeMs: number,
    writerExp: string | null | undefined,
    generation: number,
    tokenType: 'DPoP' | undefined,
  ): string | undefined {
    let accessToken: string;
    try {
      // The clear fields and the highest generation seen are authenticated with the value: an
      // edited expiry, or a value put back after a revoke, fails to open.
      accessToken = this.cipher.open(
        clientId,
        val,
        recordContext(fp, lifetimeMs, writerExp ?? '', tokenType),
        generation,
      );
    } catch {
      return undefined;
    }
    // The fingerprint is in clear for the fence; it must be this token's.
    return fingerprintOf(accessToken) === fp ? accessToken : undefined;
  }

  private corrupt(clientId: string, val: string): StoredToken {
    this.lastCorrupt.set(clientId, val);
    return { status: 'corrupt' };
  }

  deliver(clientId: string, message: string): void {
    let event: TokenStoreEvent | undefined;
    if (message.startsWith('u:')) {
      event = { type: 'updated', clientId, fingerprint: message.slice(2) };
    } else if (message.startsWith('i:')) {
      event = { type: 'invalidated', clientId, fingerprint: message.slice(2) };
    } else if (message.startsWith('r:')) {
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

function chunked<T>(items: readonly T[], size = READ_MANY_CHUNK): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

/** Beyond any clock skew the fleet tolerates, far below a token's lifetime. */
const MAX_WRITER_SKEW_MS = 5 * 60_000;

function checkedExpiry(
  expRedis: number,
  offset: { upper: number; lower: number },
  writerExp: string | null | undefined,
): number | undefined {
  const writerExpiresAt = Number(writerExp);
  const expiresAt = localExpiry(expRedis, offset, writerExpiresAt);
  // Redis computes `exp`, so it is not authenticated; the writer's expiry is.
  const overclaims = expiresAt > writerExpiresAt + MAX_WRITER_SKEW_MS;
  return Number.isFinite(writerExpiresAt) && overclaims ? undefined : expiresAt;
}

/** The fields kept in clear; the token type only when there is one, as older versions wrote. */
function recordContext(
  fingerprint: string,
  lifetimeMs: number,
  writerExpiresAt: string,
  tokenType?: string,
): string {
  const context = `fp=${fingerprint};life=${lifetimeMs};wexp=${writerExpiresAt}`;
  return tokenType === undefined ? context : `${context};typ=${tokenType}`;
}

const CLOCK_GRAIN_MS = 2;

/**
 * Redis anchors the writer's duration a write's latency after the writer read its clock, so the
 * stored expiry can over-claim that much; a hint a little earlier only under-claims (safe).
 */
const HINT_BELOW_MS = 500;

/**
 * The true local expiry lies in `[expRedis − upper, expRedis − lower]`; the conservative answer is
 * its start. The writer's figure is used when it lies inside, so replicas whose clocks agree keep
 * the exact same expiry.
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
