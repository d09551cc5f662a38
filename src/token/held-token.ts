import type { MetricsService } from '../metrics/metrics.service';
import { MIN_SERVE_MS } from './refresh-schedule';
import { RejectedFingerprints } from './rejected-fingerprints';
import type { TokenRecord } from './token-record';

/** How this replica last came by a token, or failed to (admin status). */
export interface LastRefresh {
  at: number;
  outcome: 'fetched' | 'adopted' | 'failed';
}

/** Collaborators of a {@link HeldToken}; the manager's own. */
export interface HeldTokenDeps {
  metrics: Pick<MetricsService, 'tokenRemaining' | 'lastRefreshSuccess'>;
  now: () => number;
}

/**
 * The token one client's manager holds in memory (L1), and the rules for what it may hold:
 * never a token the provider refused, never one of a generation older than the fleet's, and a
 * token only replaced by one that expires later. Keeps the remaining-lifetime gauge in step.
 */
export class HeldToken {
  private record?: TokenRecord;
  /**
   * Fingerprints the provider refused (oldest first). Never adopted again, whether from a pass,
   * a store read or a pub/sub message that started before the rejection: so a caller asking
   * after an invalidation gets a different token without polling.
   */
  private readonly rejected = new RejectedFingerprints();
  /** The fleet's revocation generation as this replica knows it (see `TokenStore.revoke`). */
  private knownGeneration = 0;
  private obtained = false;
  /** L1 holds a token the shared store may lack (it was down): push it on recovery. */
  needsResync = false;
  /** When this replica last adopted or obtained a token, and how (admin status). */
  lastRefresh?: LastRefresh;
  private readonly remainingGauge;
  private readonly lastSuccessGauge;

  constructor(
    clientId: string,
    private readonly deps: HeldTokenDeps,
  ) {
    this.remainingGauge = deps.metrics.tokenRemaining.labels(clientId);
    this.lastSuccessGauge = deps.metrics.lastRefreshSuccess.labels(clientId);
  }

  /** The token held, expired or not; undefined when none is (or it is set aside). */
  get current(): TokenRecord | undefined {
    return this.record;
  }

  /** The fleet's revocation generation as this replica knows it. */
  get generation(): number {
    return this.knownGeneration;
  }

  /** Whether this replica ever held a token. */
  get everObtained(): boolean {
    return this.obtained;
  }

  /** Hot path: the token if it has at least `minRemainingMs` left. No I/O, no promise. */
  servable(minRemainingMs: number): TokenRecord | undefined {
    const r = this.record;
    return r !== undefined &&
      r.expiresAt - this.deps.now() >= Math.max(minRemainingMs, MIN_SERVE_MS)
      ? r
      : undefined;
  }

  /** The token while it has not expired. */
  valid(): TokenRecord | undefined {
    return this.record && this.record.expiresAt > this.deps.now() ? this.record : undefined;
  }

  /** Whether the provider refused (or the fleet revoked) the token with `fingerprint`. */
  isRejected(fingerprint: string): boolean {
    return this.rejected.has(fingerprint);
  }

  /** Whether `record` is of the fleet's current revocation generation (or a newer one). */
  ofGeneration(record: TokenRecord): boolean {
    return (record.generation ?? 0) >= this.knownGeneration;
  }

  /** Whether `record` may be held at all: neither refused nor of a revoked generation. */
  mayHold(record: TokenRecord): boolean {
    return !this.rejected.has(record.fingerprint) && this.ofGeneration(record);
  }

  /** Whether `record` expires later than the token held (true when none is). */
  outlastedBy(record: TokenRecord): boolean {
    return !this.record || record.expiresAt > this.record.expiresAt;
  }

  /** The token with `fingerprint` is never held again; the one held now is kept. */
  refuse(fingerprint: string): void {
    this.rejected.add(fingerprint);
  }

  /**
   * The token with `fingerprint` is never held again, and dropped if it is the one held now:
   * whether it was.
   */
  reject(fingerprint: string): boolean {
    this.rejected.add(fingerprint);
    if (this.record?.fingerprint !== fingerprint) return false;
    this.drop();
    return true;
  }

  /**
   * Holds `record` unless the token held is newer (`forced`: whatever the one held), counts it
   * obtained and updates the gauges. Returns the token held afterwards.
   */
  keep(record: TokenRecord, forced = false): TokenRecord {
    const cur = this.record;
    if (forced) this.record = record;
    else if (!cur || record.expiresAt > cur.expiresAt || record.fingerprint !== cur.fingerprint) {
      if (!cur || record.expiresAt >= cur.expiresAt) this.record = record;
    }
    const held = this.record!;
    this.obtained = true;
    this.remainingGauge.set(Math.max(0, (held.expiresAt - this.deps.now()) / 1000));
    this.lastSuccessGauge.set(this.deps.now() / 1000);
    return held;
  }

  /** Drops the token held: nothing is served until the next one. */
  drop(): void {
    this.record = undefined;
    this.remainingGauge.set(0);
  }

  /**
   * Sets the token held aside while the generation is unknown (the store is back after an
   * outage): nothing is served meanwhile. The gauge keeps it: {@link restore} may bring it back.
   */
  setAside(): void {
    this.record = undefined;
  }

  /** Holds `record` again, set aside by {@link setAside}, if nothing replaced it and no revoke. */
  restore(record: TokenRecord | undefined): void {
    if (this.record === undefined && record && this.ofGeneration(record)) this.record = record;
  }

  /**
   * The fleet revoked every token before `generation`: the held one of an older generation, and
   * `setAside` too, are never held again, and the held one is dropped. Returns what was dropped.
   */
  revoke(generation: number, setAside?: TokenRecord): TokenRecord | undefined {
    this.knownGeneration = generation;
    for (const r of [this.record, setAside]) {
      if (r !== undefined && !this.ofGeneration(r)) this.rejected.add(r.fingerprint);
    }
    const dropped = this.record;
    if (dropped === undefined || this.ofGeneration(dropped)) return undefined;
    this.drop();
    return dropped;
  }

  /** Records how this replica last came by a token, or failed to (admin status). */
  noteRefresh(outcome: LastRefresh['outcome']): void {
    this.lastRefresh = { at: this.deps.now(), outcome };
  }
}
