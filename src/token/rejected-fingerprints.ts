/**
 * How many rejected fingerprints a manager remembers. A rejected token is gone from the store
 * within a refresh or two; the newest few cover every read that can still be in flight.
 */
const REMEMBERED_REJECTIONS = 16;

/** Fingerprints of tokens the provider refused or the fleet revoked, newest kept, bounded. */
export class RejectedFingerprints {
  /** Oldest first. */
  private readonly seen = new Set<string>();

  add(fingerprint: string): void {
    this.seen.delete(fingerprint);
    this.seen.add(fingerprint);
    if (this.seen.size > REMEMBERED_REJECTIONS) {
      this.seen.delete(this.seen.values().next().value!);
    }
  }

  has(fingerprint: string): boolean {
    return this.seen.has(fingerprint);
  }
}
