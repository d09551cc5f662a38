import type { Logger } from 'pino';
import {
  BurstyRateLimiter,
  type RateLimiterAbstract,
  RateLimiterMemory,
  RateLimiterRedis,
  RateLimiterRes,
} from 'rate-limiter-flexible';
import type { ForwardSettings } from '../config/provider.schema';
import type {
  ForwardRateLimiter,
  RateLimitedRoute,
  RateLimitScope,
  RateLimitVerdict,
} from '../forwarding/forward-rate-limiter';
import type { RedisClient } from './redis.connection';

const BURST_WINDOW_SECONDS = 10;
const FALLBACK_LOG_INTERVAL_MS = 30_000;

/** The rates of one route: `forward` and `orders` have the same four settings. */
export type RateSettings = Pick<
  ForwardSettings,
  'clientRatePerSecond' | 'clientRateBurst' | 'callerRatePerSecond' | 'callerRateBurst'
>;

/** Counter key prefixes: the passthrough's predate the orders' and stay as they were. */
const PREFIXES: Record<RateLimitedRoute, string> = { forward: 'tb:rl', orders: 'tb:rl:orders' };

/** How the fallback warning names the route and its metric. */
const NAMES: Record<RateLimitedRoute, [string, string]> = {
  forward: ['passthrough', 'token_broker_forward_rate_limit_fallback_total'],
  orders: ['POST /orders', 'token_broker_orders_rate_limit_fallback_total'],
};

type LimitOptions = ConstructorParameters<typeof RateLimiterMemory>[0];

type Limiter = Pick<RateLimiterAbstract, 'consume'>;

interface Pair {
  readonly redis?: Limiter;
  readonly memory: Limiter;
}

/**
 * A fixed 1-second window backed by a bursty 10-second one, per limit; counters in Redis are
 * shared by the fleet (hash-tagged by client for Cluster). Without Redis, or while it does not
 * answer, the same limits count in memory: the provider stays protected per replica, never by
 * failing calls.
 */
export class RedisForwardRateLimiter implements ForwardRateLimiter {
  private readonly client: Pair | undefined;
  private readonly caller: Pair | undefined;
  private lastFallbackLog = 0;

  constructor(
    redis: RedisClient | null,
    settings: RateSettings,
    private readonly logger: Logger,
    private readonly profile: RateLimitedRoute = 'forward',
  ) {
    const prefix = PREFIXES[profile];
    this.client = pair(
      redis,
      `${prefix}:client`,
      settings.clientRatePerSecond,
      settings.clientRateBurst,
    );
    this.caller = pair(
      redis,
      `${prefix}:caller`,
      settings.callerRatePerSecond,
      settings.callerRateBurst,
    );
  }

  async consume(clientId: string, caller: string): Promise<RateLimitVerdict> {
    let degraded = false;
    // The caller's limit first: a caller over its own limit should not use up the client's.
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

  /** Counted in Redis, or in memory when Redis is not there or did not answer. */
  private async consumeOne(
    limits: Pair,
    key: string,
  ): Promise<{ degraded: boolean; refusedMs?: number }> {
    if (limits.redis) {
      try {
        return { degraded: false, refusedMs: await refusal(limits.redis, key) };
      } catch (err) {
        this.fellBack(err);
      }
    }
    return { degraded: limits.redis !== undefined, refusedMs: await refusal(limits.memory, key) };
  }

  private fellBack(err: unknown): void {
    const now = Date.now();
    if (now - this.lastFallbackLog < FALLBACK_LOG_INTERVAL_MS) return;
    this.lastFallbackLog = now;
    this.logger.warn(
      { err: err instanceof Error ? err.message : String(err) },
      `${NAMES[this.profile][0]} rate limits counted in this replica only: Redis did not answer. Each replica now allows the full rate (the fleet up to N times it) until Redis is back; see ${NAMES[this.profile][1]}`,
    );
  }
}

/** How long until `key` may go again, or `undefined` when it is allowed now. */
async function refusal(limiter: Limiter, key: string): Promise<number | undefined> {
  try {
    await limiter.consume(key);
    return undefined;
  } catch (err) {
    if (err instanceof RateLimiterRes) return err.msBeforeNext;
    throw err;
  }
}

/** The same limits in memory and, with a Redis, in Redis; `undefined` when the limit is off. */
function pair(
  redis: RedisClient | null,
  keyPrefix: string,
  perSecond: number,
  burst: number,
): Pair | undefined {
  if (perSecond === 0) return undefined;
  const limits = (make: (options: LimitOptions) => RateLimiterAbstract): Limiter => {
    const rate = make({ keyPrefix, points: perSecond, duration: 1 });
    if (burst === 0) return rate;
    const bursts = make({
      keyPrefix: `${keyPrefix}:burst`,
      points: burst,
      duration: BURST_WINDOW_SECONDS,
    });
    return new BurstyRateLimiter(rate, bursts);
  };
  const memory = limits((options) => new RateLimiterMemory(options));
  if (!redis) return { memory };
  // Refuse at once while disconnected (memory takes over) instead of queueing.
  const shared = limits(
    (options) =>
      new RateLimiterRedis({ ...options, storeClient: redis, rejectIfRedisNotReady: true }),
  );
  return { redis: shared, memory };
}
