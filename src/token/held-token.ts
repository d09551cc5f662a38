import { MIN_SERVE_MS } from './refresh-schedule';
import type { TokenRecord } from './token-record';

/** A rejected token leaves the store within a refresh or two; this covers reads in flight. */
const REMEMBERED_REJECTIONS = 16;

/** What *this* replica last did about its token: never another replica's outcome. */
export interface LastRefresh {
  at: number;
  /** `fetched`: this replica's own provider request; `adopted`: taken from the store. */
  outcome: 'fetched' | 'adopted' | 'failed';
  /** An operator's forced refresh made on this replica. */
  forced?: true;
}

/**
 * L1: never a token of a revoked generation, never one the provider refused adopted again (unless
 * granted again after the refusal: some providers re-issue a token until it expires), and only
 * replaced by one that expires later or by any acceptable one when the held token was refused.
 * A refused token stays held for `GET /token` until its replacement is in hand, since a refusal
 * is a caller's call's evidence, not a verdict; calls forwarded by the broker skip it.
 */
export class HeldToken {
  private record?: TokenRecord;
  /**
   * Refused fingerprints and when: a grant of the same token requested before then is never
   * adopted again, even from a pass or message already started. Made on the first refusal: most
   * clients never see one, and an empty map costs a few hundred bytes per client.
   */
  private rejected?: Map<string, number>;
  /** The fleet's revocation generation as this replica knows it. */
  private knownGeneration = 0;
  private obtained = false;
  /** Held a token the store may lack (it was down): push it on recovery. */
  needsResync = false;
  lastRefresh?: LastRefresh;

  constructor(private readonly now: () => number) {}

  get current(): TokenRecord | undefined {
    return this.record;
  }

  get generation(): number {
    return this.knownGeneration;
  }

  get everObtained(): boolean {
    return this.obtained;
  }

  servable(minRemainingMs: number): TokenRecord | undefined {
    const r = this.record;
    return r !== undefined && r.expiresAt - this.now() >= Math.max(minRemainingMs, MIN_SERVE_MS)
      ? r
      : undefined;
  }

  valid(): TokenRecord | undefined {
    return this.record && this.record.expiresAt > this.now() ? this.record : undefined;
  }

  /** Refused, and `record` was requested before the refusal. */
  isRejected(record: Pick<TokenRecord, 'fingerprint' | 'obtainedAt'>): boolean {
    const at = this.rejected?.get(record.fingerprint);
    return at !== undefined && record.obtainedAt <= at;
  }

  /** A grant after the refusal of the same token: the provider re-issued what it had refused. */
  reissued(record: TokenRecord): boolean {
    return this.rejected?.has(record.fingerprint) === true && !this.isRejected(record);
  }

  /** What a forwarded call may send: servable and not refused. */
  forwardable(minRemainingMs: number): TokenRecord | undefined {
    const r = this.servable(minRemainingMs);
    return r !== undefined && !this.isRejected(r) ? r : undefined;
  }

  ofGeneration(record: TokenRecord): boolean {
    return (record.generation ?? 0) >= this.knownGeneration;
  }

  mayHold(record: TokenRecord): boolean {
    return !this.isRejected(record) && this.ofGeneration(record);
  }

  outlastedBy(record: TokenRecord): boolean {
    return !this.record || record.expiresAt > this.record.expiresAt;
  }

  refuse(fingerprint: string): void {
    const rejected = (this.rejected ??= new Map<string, number>());
    rejected.delete(fingerprint);
    rejected.set(fingerprint, this.now());
    if (rejected.size > REMEMBERED_REJECTIONS) rejected.delete(rejected.keys().next().value!);
  }

  /** Whether the token was the one held (kept for `GET /token` until replaced). */
  reject(fingerprint: string): boolean {
    this.refuse(fingerprint);
    return this.record?.fingerprint === fingerprint;
  }

  /** `forced`: whatever the one held. Returns the token held afterwards. */
  keep(record: TokenRecord, forced = false): TokenRecord {
    const cur = this.record;
    const replaces =
      this.outlastedBy(record) ||
      (cur?.expiresAt === record.expiresAt && record.fingerprint !== cur.fingerprint) ||
      (cur !== undefined && this.isRejected(cur) && !this.isRejected(record));
    if (forced || replaces) this.record = record;
    this.obtained = true;
    return this.record!;
  }

  /** While the generation is unknown; {@link restore} may bring it back. */
  setAside(): void {
    this.record = undefined;
  }

  restore(record: TokenRecord | undefined): void {
    if (this.record === undefined && record && this.ofGeneration(record)) this.record = record;
  }

  /** `setAside` of an older generation is never held again either. Returns what was dropped. */
  revoke(generation: number, setAside?: TokenRecord): TokenRecord | undefined {
    this.knownGeneration = generation;
    for (const r of [this.record, setAside]) {
      if (r !== undefined && !this.ofGeneration(r)) this.refuse(r.fingerprint);
    }
    const dropped = this.record;
    if (dropped === undefined || this.ofGeneration(dropped)) return undefined;
    this.record = undefined;
    return dropped;
  }

  noteRefresh(outcome: LastRefresh['outcome'], forced = false): void {
    this.lastRefresh = { at: this.now(), outcome, ...(forced && { forced: true }) };
  }
}
