/**
 * When full, the oldest entry goes: a fleet re-presents the same few tokens, so recency tracking
 * would buy little and cost a delete and re-insert on every hit.
 */
export class VerifiedTokenCache<T> {
  private readonly entries = new Map<string, { readonly value: T; readonly expiresAt: number }>();

  constructor(private readonly capacity: number) {}

  get size(): number {
    return this.entries.size;
  }

  get(key: string, now: number): T | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= now) {
      this.entries.delete(key);
      return undefined;
    }
    return entry.value;
  }

  /** Every entry: what they hold was decided under rules that changed. */
  clear(): void {
    this.entries.clear();
  }

  set(key: string, value: T, expiresAt: number): void {
    this.entries.delete(key);
    if (this.entries.size >= this.capacity) {
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.entries.delete(oldest.value);
    }
    this.entries.set(key, { value, expiresAt });
  }
}
