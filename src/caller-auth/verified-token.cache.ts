/**
 * What verifying a credential proved, keyed by the credential's hash and kept until the
 * credential expires, so a repeat caller costs one hash and one Map lookup.
 *
 * Bounded: when full, the oldest entry goes (Map iteration order is insertion order). A busy
 * fleet re-presents the same few tokens, so recency-of-use tracking would buy little and
 * would cost a delete and re-insert on every hit of the hot path.
 */
export class VerifiedTokenCache<T> {
  private readonly entries = new Map<string, { readonly value: T; readonly expiresAt: number }>();

  constructor(private readonly capacity: number) {}

  get size(): number {
    return this.entries.size;
  }

  /** The value for `key` while `now` is before its expiry; an expired entry is dropped. */
  get(key: string, now: number): T | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= now) {
      this.entries.delete(key);
      return undefined;
    }
    return entry.value;
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
