import type { Logger } from 'pino';
import {
  BurstyRateLimiter,
  RateLimiterMemory,
  RateLimiterRedis,
  RateLimiterRes,
} from 'rate-limiter-flexible';
import type { ForwardSettings } from '../config/provider.schema';
import type {
  ForwardRateLimiter,
  RateLimitScope,
  RateLimitVerdict,
} from '../forwarding/forward-rate-limiter';
import type { RedisClient } from './redis.connection';

/** The window a burst is spread over: `burst` extra requests per 10 s above the rate. */
const BURST_WINDOW_SECONDS = 10;
/** At most one "fell back to memory" warning per this long, however many requests meet it. */
const FALLBACK_LOG_INTERVAL_MS = 30_000;

/** Something that consumes points, Redis-backed or in memory (both limiter kinds fit). */
interface Limiter {
  consume(key: string): Promise<RateLimiterRes>;
}

interface Pair {
  readonly redis?: Limiter;
  readonly memory: Limiter;
}

/**
 * {@link ForwardRateLimiter} on rate-limiter-flexible: a fixed 1-second window of `perSecond`
 * points, backed by a {@link BurstyRateLimiter} of `burst` points per 10 s, for each limit.
 * With Redis, the counters are Redis keys shared by the fleet (one Lua script per consume, one
 * key each, hash-tagged by client so Cluster keeps them in one slot); without Redis, or when
 * Redis does not answer (the limiter refuses at once unless the connection is ready), the same
 * limits are counted in this replica's memory: the provider is then protected per replica,
 * never by failing calls. Each fallback is counted (`degraded`) and logged at most every 30 s.
 */
export class RedisForwardRateLimiter implements ForwardRateLimiter {
  private readonly client: Pair | undefined;
  private readonly caller: Pair | undefined;
  private lastFallbackLog = 0;

  constructor(
    redis: RedisClient | null,
    settings: ForwardSettings,
    private readonly logger: Logger,
  ) {
    this.client = pair(redis, 'client', settings.clientRatePerSecond, settings.clientRateBurst);
    this.caller = pair(redis, 'caller', settings.callerRatePerSecond, settings.callerRateBurst);
  }

  async consume(clientId: string, caller: string): Promise<RateLimitVerdict> {
    let degraded = false;
    // The client's limit first: a caller over its own limit should not use up the client's.
    const checks: [RateLimitScope, Pair | undefined, string][] = [
      ['caller', this.caller, `{${clientId}}:${caller}`],
      ['client', this.client, `{${clientId}}`],
    ];
    for (const [scope, limits, key] of checks) {
      if (!limits) continue;
      const verdict = await this.consumeOne(limits, key);
      degraded ||= verdict.degraded;
      if (verdict.refusedMs !== undefined) {
        return { allowed: false, degraded, scope, retryAfterMs: verdict.refusedMs };
      }
    }
    return { allowed: true, degraded };
  }

  private async consumeOne(
    limits: Pair,
    key: string,
  ): Promise<{ degraded: boolean; refusedMs?: number }> {
    if (limits.redis) {
      try {
        await limits.redis.consume(key);
        return { degraded: false };
      } catch (err) {
        if (err instanceof RateLimiterRes) return { degraded: false, refusedMs: err.msBeforeNext };
        this.fellBack(err);
      }
    }
    try {
      await limits.memory.consume(key);
      return { degraded: limits.redis !== undefined };
    } catch (err) {
      if (err instanceof RateLimiterRes) {
        return { degraded: limits.redis !== undefined, refusedMs: err.msBeforeNext };
      }
      throw err;
    }
  }

  private fellBack(err: unknown): void {
    const now = Date.now();
    if (now - this.lastFallbackLog < FALLBACK_LOG_INTERVAL_MS) return;
    this.lastFallbackLog = now;
    this.logger.warn(
      { err: err instanceof Error ? err.message : String(err) },
      'passthrough rate limits counted in this replica only: Redis did not answer. Each replica now allows the full rate (the fleet up to N times it) until Redis is back; see token_broker_forward_rate_limit_fallback_total',
    );
  }
}

/** The Redis and memory limiters of one limit; `undefined` when the limit is off. */
function pair(
  redis: RedisClient | null,
  name: string,
  perSecond: number,
  burst: number,
): Pair | undefined {
  if (perSecond === 0) return undefined;
  const keyPrefix = `tb:rl:${name}`;
  const memory = bursty(
    new RateLimiterMemory({ keyPrefix, points: perSecond, duration: 1 }),
    burst === 0
      ? undefined
      : new RateLimiterMemory({
          keyPrefix: `${keyPrefix}:burst`,
          points: burst,
          duration: BURST_WINDOW_SECONDS,
        }),
  );
  if (!redis) return { memory };
  const store = (prefix: string, points: number, duration: number) =>
    new RateLimiterRedis({
      storeClient: redis,
      keyPrefix: prefix,
      points,
      duration,
      // Refuse at once while disconnected (the memory limiter takes over) instead of
      // queueing behind ioredis's reconnection.
      rejectIfRedisNotReady: true,
    });
  return {
    redis: bursty(
      store(keyPrefix, perSecond, 1),
      burst === 0 ? undefined : store(`${keyPrefix}:burst`, burst, BURST_WINDOW_SECONDS),
    ),
    memory,
  };
}

function bursty(rate: Limiter, burst: Limiter | undefined): Limiter {
  return burst ? new BurstyRateLimiter(rate as never, burst as never) : rate;
}
