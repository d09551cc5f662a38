import { type FleetBus, REPLICA_ID, type Revocation } from '../token/token-store';
import { redisKeys } from './redis.constants';
import type { RedisStoreHealth } from './store-health.redis';

/** The admin answer reads them at once. */
const REVOCATION_ACKS_TTL_MS = 10 * 60_000;

/** Generations are never-expiring integers, acknowledgements a set per generation. */
export class RedisFleetBus implements FleetBus {
  private readonly generations = new Map<string, number>();
  private readonly reloadListeners: Array<(from: string) => void> = [];

  constructor(private readonly health: RedisStoreHealth) {}

  async revoke(clientId: string): Promise<Revocation> {
    const [generation, fingerprint, delivered] = await this.health.run((redis) =>
      redis.tbRevoke(
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
    await this.health.run((redis) => redis.tbAcknowledge(key, REPLICA_ID, REVOCATION_ACKS_TTL_MS));
  }

  async revocationAcks(clientId: string, generation: number): Promise<number> {
    return this.health.run((redis) => redis.scard(redisKeys.revocationAcks(clientId, generation)));
  }

  async requestReload(): Promise<number> {
    return this.health.run((redis) => redis.publish(redisKeys.reloadChannel, REPLICA_ID));
  }

  onReloadRequested(listener: (from: string) => void): void {
    this.reloadListeners.push(listener);
  }

  /** Returns the highest generation seen for `clientId`. */
  learnGeneration(clientId: string, generation: number): number {
    const known = this.generations.get(clientId) ?? 0;
    if (Number.isSafeInteger(generation) && generation > known) {
      this.generations.set(clientId, generation);
      return generation;
    }
    return known;
  }

  reloadRequested(from: string): void {
    for (const l of this.reloadListeners) l(from);
  }
}
