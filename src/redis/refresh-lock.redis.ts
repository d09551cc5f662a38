import { ExecutionError, Redlock, ResourceLockedError } from '@sesamecare-oss/redlock';
import {
  type LockState,
  type Locked,
  type RefreshHold,
  type RefreshLock,
  REPLICA_ID,
} from '../token/token-store';
import { redisKeys } from './redis.constants';
import type { RedisStoreHealth } from './store-health.redis';

/** The pause before the one retry of a lock command (see the constructor). */
const LOCK_RETRY_DELAY_MS = 20;

/**
 * The fleet refresh lock on Redis (a redlock lease per client, with the holder's name beside
 * it for the admin status), and the fleet's backoff and refresh floor (keys whose TTL runs on
 * Redis's clock).
 */
export class RedisRefreshLock implements RefreshLock {
  private readonly redlock: Redlock;

  constructor(
    private readonly health: RedisStoreHealth,
    private readonly lockTtlMs: number,
    commandTimeoutMs: number,
  ) {
    // A held lock means another replica is refreshing, and waiting for its pub/sub message beats
    // polling the lock: one retry only. That retry's pause matters for the extension: `using`
    // retries a failed extension at once until the lease ends, and while Redis refuses at once
    // (connections gone) only the pause between attempts lets timers and requests run.
    this.redlock = new Redlock([health.redis], {
      retryCount: 1,
      retryDelay: LOCK_RETRY_DELAY_MS,
      retryJitter: 0,
      // Extend when a third of the lease is left, or four command timeouts if less.
      automaticExtensionThreshold: Math.min(Math.floor(lockTtlMs / 3), 4 * commandTimeoutMs),
    });
    this.redlock.on('error', () => undefined);
  }

  async withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>> {
    // Settled inside the routine: redlock's release error must neither hide nor replace it.
    let ran: { value: T } | { error: unknown } | undefined;
    try {
      // `using` extends the lease while `fn` runs, so a slow refresh keeps it; a dead holder's
      // lease runs out after lockTtlMs and another replica takes over. A lease lost anyway
      // does not stop `fn`: the lock is an efficiency lock, the fenced write is the guarantee.
      await this.redlock.using([redisKeys.lock(clientId)], this.lockTtlMs, async () => {
        this.health.markHealthy();
        // Who holds it, for the admin status (shown only while the lock key exists).
        this.health.redis.set(redisKeys.lockHolder(clientId), REPLICA_ID).catch(() => undefined);
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
        throw this.health.unavailable(cause, 'acquiring the refresh lock');
      }
    }
    const settled = ran as { value: T } | { error: unknown };
    if ('error' in settled) throw settled.error;
    return { acquired: true, value: settled.value };
  }

  async lockState(clientId: string): Promise<LockState> {
    const [ttl, holder] = await this.health.run(() =>
      Promise.all([
        this.health.redis.pttl(redisKeys.lock(clientId)),
        this.health.redis.get(redisKeys.lockHolder(clientId)),
      ]),
    );
    return ttl > 0 ? { held: true, holder: holder ?? undefined, ttlMs: ttl } : { held: false };
  }

  async deferRefresh(clientId: string, delayMs: number): Promise<number> {
    return this.health.run(() =>
      this.health.redis.tbDeferRefresh(
        redisKeys.backoff(clientId),
        Math.max(0, Math.ceil(delayMs)),
      ),
    );
  }

  async refreshDeferral(clientId: string): Promise<number> {
    // PTTL is -2 (no key) or -1 (no expiry, never set by us): both mean "not deferred".
    const left = await this.health.run(() => this.health.redis.pttl(redisKeys.backoff(clientId)));
    return Math.max(0, left);
  }

  async holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void> {
    await this.health.run(() =>
      this.health.redis.set(
        redisKeys.floor(clientId),
        String(Math.max(0, Math.round(lifetimeMs))),
        'PX',
        Math.max(1, Math.ceil(intervalMs)),
      ),
    );
  }

  async refreshHold(clientId: string): Promise<RefreshHold> {
    const [left, value] = await this.health.run(() =>
      this.health.redis.tbRefreshHold(redisKeys.floor(clientId)),
    );
    // PTTL is -2 (no key) or -1 (no expiry, never set by us): both mean "no floor".
    if (!(left > 0)) return { ms: 0 };
    const lifetimeMs = Number(value);
    // Anything but a plain number (written by hand, foreign) names no lifetime.
    return Number.isSafeInteger(lifetimeMs) && lifetimeMs > 0
      ? { ms: left, lifetimeMs }
      : { ms: left };
  }
}

/** True when redlock failed only because another holder has the lock. */
async function isHeldElsewhere(cause: unknown): Promise<boolean> {
  if (!(cause instanceof ExecutionError)) return false;
  const stats = await Promise.all(cause.attempts);
  const errors = stats.flatMap((s) => [...s.votesAgainst.values()]);
  return errors.length > 0 && errors.every((e) => e instanceof ResourceLockedError);
}
