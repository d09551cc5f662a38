/** A rejected token leaves the store within a refresh or two; this covers reads in flight. */
const REMEMBERED_REJECTIONS = 16;

export class RejectedFingerprints {
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
