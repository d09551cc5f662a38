import { type Fleet, FLEET_CLIENT, startFleet } from './fleet';
import { hammer, type HammerResponse, type HammerResult } from './load';
import type { TestRedis } from './redis/standalone';
import type { RedisTopology } from './redis/topology';
import { TokenWatch } from './token-watch';

/**
 * Three replicas: after a fault scenario kills or stops one, two are still left to contend for
 * the refresh lock, which is what the lock and convergence assertions are about.
 */
const FAULT_FLEET_SIZE = 3;

/** Options for {@link startFaultFleet}. */
export interface FaultFleetOptions<R extends TestRedis | RedisTopology = TestRedis> {
  /** Lifetime of every token the provider emulator issues, in seconds. */
  lifetimeS: number;
  /** How long before expiry the broker refreshes (`TOKEN_REFRESH_AHEAD_SECONDS`), in seconds. */
  aheadS: number;
  /**
   * The settings the scenario is about (lock TTL, timeouts, backoff, a proxied `REDIS_URL`),
   * on top of {@link startFleet}'s common ones.
   */
  env?: Record<string, string>;
  /**
   * A Redis the scenario flushes, kills or restarts itself, and stops after the fleet. Without
   * it the fleet starts (and stops) its own.
   */
  redis?: R;
  /** Every broker also has an admin listener, where readiness answers its full report. */
  admin?: boolean;
  /** Where the brokers read the client's credentials (see {@link startFleet}). */
  secrets?: 'file' | 'secrets-manager';
}

/**
 * Starts the fleet a fault scenario runs against: three brokers, and a
 * provider whose token lifetime the brokers also take as their default lifetime.
 *
 * The scenarios time their faults from the token lifetime (right after a refresh, then the
 * window before expiry), so broker and provider must not disagree on it: with the broker's
 * default (30 minutes) an answer without `expires_in` would be believed to last far longer
 * than the provider let it.
 */
export async function startFaultFleet<R extends TestRedis | RedisTopology = TestRedis>(
  opts: FaultFleetOptions<R>,
): Promise<Fleet<R>> {
  return startFleet<R>({
    size: FAULT_FLEET_SIZE,
    redis: opts.redis,
    admin: opts.admin,
    secrets: opts.secrets,
    knobs: { tokenLifetimeSeconds: opts.lifetimeS },
    env: {
      TOKEN_REFRESH_AHEAD_SECONDS: String(opts.aheadS),
      TOKEN_DEFAULT_LIFETIME_SECONDS: String(opts.lifetimeS),
      ...opts.env,
    },
  });
}

/** Options for {@link startTokenLoad}. */
export interface TokenLoadOptions {
  /**
   * Request loops running at once, spread round-robin over the replicas.
   * @default 8
   */
  concurrency?: number;
  /**
   * Sees every response before the {@link TokenWatch} judges it: for figures of the scenario's
   * own (latency before and during a fault), not for verdicts, which belong to the watch.
   */
  observe?: (res: HammerResponse) => void;
}

/** A {@link startTokenLoad} run in progress. */
export interface TokenLoad {
  /** Base URLs of the fleet's brokers, in fleet order, as the load addresses them. */
  readonly urls: string[];
  /** Judges every answer; read its refusals and served tokens after {@link TokenLoad.stop}. */
  readonly watch: TokenWatch;
  /**
   * Starts no further request, waits for those in flight, and resolves with the totals. Safe
   * to call again (from a `finally`): it resolves with the same result.
   */
  stop(): Promise<HammerResult>;
}

/**
 * Starts callers asking every broker of `fleet` for a token until {@link TokenLoad.stop}, in the
 * background, while the scenario injects its fault.
 *
 * Every answer counts as a success to the load itself (`isSuccess`), because a refusal is not
 * wrong as such: whether a 503 was acceptable depends on whether a valid token existed when it
 * was sent, which only the {@link TokenWatch} can tell afterwards. The 60 s deadline (a
 * scenario's own timeout) only matters when a scenario fails before stopping the load: the
 * callers then stop by themselves instead of outliving the test.
 */
export function startTokenLoad(
  fleet: Fleet<TestRedis | RedisTopology>,
  opts: TokenLoadOptions = {},
): TokenLoad {
  const urls = fleet.brokers.map((b) => b.url);
  const watch = new TokenWatch(fleet.emulator);
  const observe = opts.observe;
  let done = false;
  const load = hammer({
    urls,
    path: `/token?client=${FLEET_CLIENT}`,
    concurrency: opts.concurrency ?? 8,
    until: () => done,
    durationMs: 60_000,
    isSuccess: () => true,
    validate: observe
      ? (res) => {
          observe(res);
          return watch.validate(res);
        }
      : watch.validate,
  });
  return {
    urls,
    watch,
    stop() {
      done = true;
      return load;
    },
  };
}
