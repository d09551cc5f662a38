import {
  callerLimit,
  type ClaimResult,
  type IdempotencyClaim,
  type IdempotencyRecord,
  type IdempotencyRef,
  type IdempotencyStore,
  type Settlement,
} from './idempotency-store';

interface Entry {
  /** For `in_flight`, `leaseRemainingMs` is filled in on lookup from `leaseUntil`. */
  record: IdempotencyRecord;
  leaseUntil?: number;
  owner: string;
  expiresAt: number;
}

/** How often expired records are swept; lookups ignore them anyway. */
const SWEEP_INTERVAL_MS = 60_000;

/**
 * One replica, with the same rules as the Redis store. Node runs each method to completion
 * before the next starts, which makes `claim` atomic without a lock.
 */
export class MemoryIdempotencyStore implements IdempotencyStore {
  private readonly entries = new Map<string, Entry>();
  /** Per client and caller, the ids of its bounded records (some may have expired since). */
  private readonly byCaller = new Map<string, Set<string>>();
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
    const max = claim.maxPerCaller ?? 0;
    if (max > 0) {
      const held = this.held(ref);
      if (held.size >= max) {
        const oldest = Math.min(...[...held].map((h) => this.entries.get(h)!.expiresAt));
        throw callerLimit(ref, max, oldest - this.now());
      }
      held.add(id);
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
  ): Promise<boolean> {
    const id = entryId(ref);
    const entry = this.live(id);
    if (!entry || entry.owner !== owner) return false;
    if (settlement.state === 'released') {
      if (entry.record.state !== 'in_flight') return false;
      this.entries.delete(id);
      this.byCaller.get(callerId(ref))?.delete(id);
      return true;
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

  private held(ref: IdempotencyRef): Set<string> {
    const key = callerId(ref);
    let held = this.byCaller.get(key);
    if (!held) this.byCaller.set(key, (held = new Set()));
    for (const id of held) if (!this.live(id)) held.delete(id);
    return held;
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
    for (const [key, held] of this.byCaller) {
      for (const id of held) if (!this.entries.has(id)) held.delete(id);
      if (held.size === 0) this.byCaller.delete(key);
    }
  }
}

function callerId(ref: IdempotencyRef): string {
  return `${ref.clientId}\u0000${ref.caller}`;
}

/** Client ids and key hashes hold no NUL, so the three parts cannot run into each other. */
function entryId(ref: IdempotencyRef): string {
  return `${ref.clientId}\u0000${ref.keyHash}\u0000${ref.caller}`;
}
