import { ExecutionError, Redlock, ResourceLockedError } from '@sesamecare-oss/redlock';
import { randomUUID } from 'node:crypto';
import {
  type EndpointCap,
  type EndpointSlot,
  type LockState,
  type Locked,
  type RefreshHold,
  type RefreshLock,
  REPLICA_ID,
} from '../token/token-store';
import { redisKeys } from './redis.constants';
import type { RedisStoreHealth } from './store-health.redis';

const LOCK_RETRY_DELAY_MS = 20;

/** Redlock lease per client, the holder's name beside it; backoff and floor are TTL keys. */
export class RedisRefreshLock implements RefreshLock {
  private readonly redlock: Redlock;

  constructor(
    private readonly health: RedisStoreHealth,
    private readonly lockTtlMs: number,
    commandTimeoutMs: number,
  ) {
    // A held lock means another replica is refreshing, and its pub/sub message beats polling:
    // one retry only. The pause matters while Redis refuses at once: `using` retries a failed
    // extension until the lease ends, and only the pause lets timers and requests run.
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
      // A lost lease does not stop `fn`: the lock is for efficiency, the fence the guarantee.
      await this.redlock.using([redisKeys.lock(clientId)], this.lockTtlMs, async () => {
        this.health.markHealthy();
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
    const [ttl, holder] = await this.health.run((redis) =>
      Promise.all([
        redis.pttl(redisKeys.lock(clientId)),
        redis.get(redisKeys.lockHolder(clientId)),
      ]),
    );
    return ttl > 0 ? { held: true, holder: holder ?? undefined, ttlMs: ttl } : { held: false };
  }

  async deferRefresh(clientId: string, delayMs: number): Promise<number> {
    return this.health.run((redis) =>
      redis.tbDeferRefresh(redisKeys.backoff(clientId), Math.max(0, Math.ceil(delayMs))),
    );
  }

  async refreshDeferral(clientId: string): Promise<number> {
    // -2 (no key) or -1 (no expiry, never set by us): both mean "not deferred".
    const left = await this.health.run((redis) => redis.pttl(redisKeys.backoff(clientId)));
    return Math.max(0, left);
  }

  async holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void> {
    await this.health.run((redis) =>
      redis.set(
        redisKeys.floor(clientId),
        String(Math.max(0, Math.round(lifetimeMs))),
        'PX',
        Math.max(1, Math.ceil(intervalMs)),
      ),
    );
  }

  async refreshHold(clientId: string): Promise<RefreshHold> {
    const [left, value] = await this.health.run((redis) =>
      redis.tbRefreshHold(redisKeys.floor(clientId)),
    );
    // -2 or -1: no floor.
    if (!(left > 0)) return { ms: 0 };
    const lifetimeMs = Number(value);
    return Number.isSafeInteger(lifetimeMs) && lifetimeMs > 0
      ? { ms: left, lifetimeMs }
      : { ms: left };
  }

  async takeEndpointSlot(endpoint: string, cap: EndpointCap): Promise<EndpointSlot> {
    const id = randomUUID();
    const inFlight = redisKeys.endpointInFlight(endpoint);
    const grants = redisKeys.endpointGrants(endpoint);
    const [granted, retryInMs] = await this.health.run((redis) =>
      redis.tbEndpointSlot(inFlight, grants, id, cap.concurrency, cap.perSecond, cap.leaseMs),
    );
    if (granted !== 1) return { granted: false, retryInMs: Number(retryInMs) };
    return {
      granted: true,
      // Best effort: the lease ends the place anyway.
      release: () =>
        this.health.redis.tbEndpointRelease(inFlight, grants, id).then(
          () => undefined,
          () => undefined,
        ),
    };
  }
}

async function isHeldElsewhere(cause: unknown): Promise<boolean> {
  if (!(cause instanceof ExecutionError)) return false;
  const stats = await Promise.all(cause.attempts);
  const errors = stats.flatMap((s) => [...s.votesAgainst.values()]);
  return errors.length > 0 && errors.every((e) => e instanceof ResourceLockedError);
}
