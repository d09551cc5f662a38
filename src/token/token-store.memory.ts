import { EndpointLimiter } from './endpoint-limiter';
import { RejectionLedger } from './rejection-ledger';
import { type TokenRecord, withGeneration } from './token-record';
import {
  type EndpointCap,
  type EndpointSlot,
  type RejectionRule,
  type RejectionVerdict,
  type LockState,
  type RefreshHold,
  type Locked,
  REPLICA_ID,
  type Revocation,
  type StoreContinuity,
  type StoredToken,
  type StoreTopology,
  type TokenRecords,
  type RefreshLock,
  type FleetBus,
  type StoreHealth,
  type TokenStore,
  type TokenStoreEvent,
} from './token-store';

interface Entry {
  record: TokenRecord;
  invalidatedAt?: number;
}

/**
 * One replica, with the same fence and invalidation rules as the Redis store. The parts share one
 * map of entries, so this one object plays all of them.
 */
export class MemoryTokenStore
  implements TokenStore, TokenRecords, RefreshLock, FleetBus, StoreHealth
{
  readonly records = this;
  readonly lock = this;
  readonly bus = this;
  readonly health = this;
  readonly kind = 'memory' as const;
  readonly healthy = true;
  private readonly entries = new Map<string, Entry>();
  private readonly locks = new Set<string>();
  private readonly listeners: Array<(e: TokenStoreEvent) => void> = [];
  private readonly deferredUntil = new Map<string, number>();
  private readonly heldUntil = new Map<string, { until: number; lifetimeMs: number }>();

  private readonly generations = new Map<string, number>();
  private readonly rejections: RejectionLedger;
  private readonly endpoints: EndpointLimiter;
  private readonly acks = new Map<string, number>();

  constructor(private readonly now: () => number = Date.now) {
    this.rejections = new RejectionLedger(now);
    this.endpoints = new EndpointLimiter(now);
  }

  async read(clientId: string): Promise<StoredToken> {
    const entry = this.entries.get(clientId);
    if (!entry || entry.invalidatedAt !== undefined || entry.record.expiresAt <= this.now()) {
      return { status: 'absent' };
    }
    return { status: 'found', record: withGeneration(entry.record, this.generation(clientId)) };
  }

  async readMany(clientIds: readonly string[]): Promise<ReadonlyMap<string, StoredToken>> {
    return new Map(
      await Promise.all(clientIds.map(async (id) => [id, await this.read(id)] as const)),
    );
  }

  async writeFenced(clientId: string, record: TokenRecord): Promise<boolean> {
    if ((record.generation ?? 0) < this.generation(clientId)) return false;
    const cur = this.entries.get(clientId);
    // Granted after the invalidation: current, even when the provider re-issued the same token.
    const afterInvalidation =
      cur?.invalidatedAt !== undefined && record.obtainedAt > cur.invalidatedAt;
    if (cur?.record.fingerprint === record.fingerprint && !afterInvalidation) return false;
    if (cur && record.expiresAt <= cur.record.expiresAt && !afterInvalidation) return false;
    this.entries.set(clientId, { record });
    this.emit({ type: 'updated', clientId, fingerprint: record.fingerprint });
    return true;
  }

  async invalidate(
    clientId: string,
    fingerprint: string,
    rule: RejectionRule,
  ): Promise<RejectionVerdict> {
    const cur = this.entries.get(clientId);
    if (!cur || cur.record.fingerprint !== fingerprint || cur.invalidatedAt !== undefined) {
      return 'stale';
    }
    const admitted = this.rejections.admit(clientId, rule);
    if (admitted !== 'ok') return admitted;
    cur.invalidatedAt = this.now();
    this.emit({ type: 'invalidated', clientId, fingerprint });
    return 'invalidated';
  }

  async discardCorrupt(clientId: string): Promise<void> {
    this.entries.delete(clientId);
    this.heldUntil.delete(clientId);
  }

  async withRefreshLock<T>(clientId: string, fn: () => Promise<T>): Promise<Locked<T>> {
    if (this.locks.has(clientId)) return { acquired: false };
    this.locks.add(clientId);
    try {
      return { acquired: true, value: await fn() };
    } finally {
      this.locks.delete(clientId);
    }
  }

  async revoke(clientId: string): Promise<Revocation> {
    const generation = this.generation(clientId) + 1;
    this.generations.set(clientId, generation);
    const cur = this.entries.get(clientId);
    if (cur && cur.invalidatedAt === undefined) cur.invalidatedAt = this.now();
    this.heldUntil.delete(clientId);
    const fingerprint = cur?.record.fingerprint;
    this.emit({ type: 'revoked', clientId, generation, fingerprint });
    return { generation, fingerprint, delivered: 1 };
  }

  generation(clientId: string): number {
    return this.generations.get(clientId) ?? 0;
  }

  async acknowledgeRevocation(clientId: string, generation: number): Promise<void> {
    this.acks.set(`${clientId}:${generation}`, 1);
  }

  async revocationAcks(clientId: string, generation: number): Promise<number> {
    return this.acks.get(`${clientId}:${generation}`) ?? 0;
  }

  async lockState(clientId: string): Promise<LockState> {
    return this.locks.has(clientId) ? { held: true, holder: REPLICA_ID } : { held: false };
  }

  topology(): StoreTopology {
    return { kind: 'memory', state: 'up' };
  }

  async deferRefresh(clientId: string, delayMs: number): Promise<number> {
    const until = Math.max(this.deferredUntil.get(clientId) ?? 0, this.now() + delayMs);
    this.deferredUntil.set(clientId, until);
    return until - this.now();
  }

  async refreshDeferral(clientId: string): Promise<number> {
    return Math.max(0, (this.deferredUntil.get(clientId) ?? 0) - this.now());
  }

  async holdRefreshes(clientId: string, intervalMs: number, lifetimeMs: number): Promise<void> {
    this.heldUntil.set(clientId, { until: this.now() + intervalMs, lifetimeMs });
  }

  async refreshHold(clientId: string): Promise<RefreshHold> {
    const hold = this.heldUntil.get(clientId);
    const ms = Math.max(0, (hold?.until ?? 0) - this.now());
    return ms > 0 ? { ms, lifetimeMs: hold!.lifetimeMs } : { ms: 0 };
  }

  async takeEndpointSlot(endpoint: string, cap: EndpointCap): Promise<EndpointSlot> {
    return this.endpoints.take(endpoint, cap);
  }

  async checkContinuity(clientIds: readonly string[]): Promise<Map<string, StoreContinuity>> {
    // Process memory lasts exactly as long as the process: nothing to lose behind its back.
    return new Map(clientIds.map((id) => [id, 'kept' as const]));
  }

  onEvent(listener: (event: TokenStoreEvent) => void): void {
    this.listeners.push(listener);
  }

  async follow(): Promise<void> {
    // Every client's events reach the listeners already.
  }

  async waitUntilReady(): Promise<boolean> {
    return true;
  }

  async close(): Promise<void> {
    this.entries.clear();
  }

  /** The admin route reloads this replica itself. */
  async requestReload(): Promise<number> {
    return 0;
  }

  onReloadRequested(): void {
    // No other replica can ask.
  }

  onRecovered(): void {
    // Memory never goes away.
  }

  private emit(event: TokenStoreEvent): void {
    for (const l of this.listeners) l(event);
  }
}
