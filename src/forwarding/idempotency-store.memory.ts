import type { ForwardingProfile } from './forwarding.exception';
import {
  callerBytes,
  callerLimit,
  type ClaimResult,
  type IdempotencyClaim,
  type IdempotencyRecord,
  type IdempotencyRef,
  type IdempotencyStore,
  type Settlement,
  storedBytes,
} from './idempotency-store';

interface Entry {
  /** For `in_flight`, `leaseRemainingMs` is filled in on lookup from `leaseUntil`. */
  record: IdempotencyRecord;
  leaseUntil?: number;
  owner: string;
  expiresAt: number;
}

/** One caller's bounded records of one route and client: what each counts, until when. */
interface Quota {
  readonly records: Map<string, { bytes: number; expiresAt: number }>;
  bytes: number;
}

/** How often expired records are swept; lookups ignore them anyway. */
const SWEEP_INTERVAL_MS = 60_000;

/**
 * One replica, with the same rules as the Redis store. Node runs each method to completion
 * before the next starts, which makes `claim` atomic without a lock.
 */
export class MemoryIdempotencyStore implements IdempotencyStore {
  private readonly entries = new Map<string, Entry>();
  /** Per route, client and caller, its bounded records (some may have expired since). */
  private readonly quotas = new Map<string, Quota>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(private readonly now: () => number = Date.now) {
    this.sweeper = setInterval(() => this.sweep(), SWEEP_INTERVAL_MS);
    this.sweeper.unref();
  }

  async claim(ref: IdempotencyRef, claim: IdempotencyClaim, ttlMs: number): Promise<ClaimResult> {
    const id = entryId(ref);
    const existing = this.live(id);
    if (existing) {
      const record = existing.record;
      return {
        claimed: false,
        existing:
          record.state === 'in_flight'
            ? { ...record, leaseRemainingMs: Math.max(0, (existing.leaseUntil ?? 0) - this.now()) }
            : record,
      };
    }
    const bound = claim.quota;
    if (bound) {
      const quota = this.held(ref, bound.profile);
      const full = bound.maxRecords > 0 && quota.records.size >= bound.maxRecords;
      const heavy = bound.maxBytes > 0 && quota.bytes + bound.reserveBytes > bound.maxBytes;
      if (full || heavy) {
        const oldest = Math.min(...[...quota.records.values()].map((r) => r.expiresAt));
        const wait = oldest - this.now();
        throw full ? callerLimit(ref, bound, wait) : callerBytes(ref, bound, wait);
      }
      quota.records.set(id, { bytes: bound.reserveBytes, expiresAt: this.now() + ttlMs });
      quota.bytes += bound.reserveBytes;
    }
    this.entries.set(id, {
      record: { state: 'in_flight', bodyHash: claim.bodyHash, leaseRemainingMs: claim.leaseMs },
      leaseUntil: this.now() + claim.leaseMs,
      owner: claim.owner,
      expiresAt: this.now() + ttlMs,
    });
    return { claimed: true };
  }

  async settle(
    ref: IdempotencyRef,
    owner: string,
    settlement: Settlement,
    ttlMs: number,
    profile?: ForwardingProfile,
  ): Promise<boolean> {
    const id = entryId(ref);
    const entry = this.live(id);
    if (!entry || entry.owner !== owner) return false;
    const quota = profile === undefined ? undefined : this.quotas.get(quotaId(ref, profile));
    const counted = quota?.records.get(id);
    if (settlement.state === 'released') {
      if (entry.record.state !== 'in_flight') return false;
      this.entries.delete(id);
      if (quota && counted) {
        quota.bytes -= counted.bytes;
        quota.records.delete(id);
      }
      return true;
    }
    if (quota && counted) {
      const bytes = storedBytes(settlement);
      quota.bytes += bytes - counted.bytes;
      quota.records.set(id, { bytes, expiresAt: this.now() + ttlMs });
    }
    const { bodyHash } = entry.record;
    // A completed answer is copied: the caller's buffer may be pooled or reused.
    const record: IdempotencyRecord =
      settlement.state === 'completed'
        ? {
            state: 'completed',
            bodyHash,
            response: { ...settlement.response, body: Buffer.from(settlement.response.body) },
          }
        : { state: 'unknown', bodyHash };
    this.entries.set(id, { record, owner, expiresAt: this.now() + ttlMs });
    return true;
  }

  private held(ref: IdempotencyRef, profile: ForwardingProfile): Quota {
    const key = quotaId(ref, profile);
    let quota = this.quotas.get(key);
    if (!quota) this.quotas.set(key, (quota = { records: new Map(), bytes: 0 }));
    this.prune(quota, this.now());
    return quota;
  }

  private prune(quota: Quota, now: number): void {
    for (const [id, counted] of quota.records) {
      if (counted.expiresAt > now && this.entries.has(id)) continue;
      quota.records.delete(id);
      quota.bytes -= counted.bytes;
    }
  }

  async close(): Promise<void> {
    clearInterval(this.sweeper);
  }

  private live(id: string): Entry | undefined {
    const entry = this.entries.get(id);
    if (entry && entry.expiresAt <= this.now()) {
      this.entries.delete(id);
      return undefined;
    }
    return entry;
  }

  private sweep(): void {
    const now = this.now();
    for (const [id, entry] of this.entries) if (entry.expiresAt <= now) this.entries.delete(id);
    for (const [key, quota] of this.quotas) {
      this.prune(quota, now);
      if (quota.records.size === 0) this.quotas.delete(key);
    }
  }
}

function quotaId(ref: IdempotencyRef, profile: ForwardingProfile): string {
  return `${profile}\u0000${ref.clientId}\u0000${ref.caller}`;
}

/** Client ids and key hashes hold no NUL, so the three parts cannot run into each other. */
function entryId(ref: IdempotencyRef): string {
  return `${ref.clientId}\u0000${ref.keyHash}\u0000${ref.caller}`;
}
