/** What {@link AuditRateLimit} left out since its last report. */
export interface SuppressedAudit {
  /** Lines left out. */
  suppressed: number;
  /** Lines left out per result (e.g. a problem code). */
  results: Record<string, number>;
  /** Epoch ms of the first and the last line left out. */
  first: number;
  last: number;
}

/**
 * At most `perSecond` individual audit lines in any one-second window; the rest are counted,
 * and {@link takeSuppressed} says how many (per result) so a later line can report them.
 *
 * Why: refusals (bad credentials, forbidden clients, bad input) stay one line each, so an
 * investigation sees every request id, but a flood of them (a credential-stuffing script, a
 * misconfigured caller in a tight loop) must not fill the node's disk or drown the other logs.
 * Nothing disappears without trace: every suppressed line is counted in a summary line.
 */
export class AuditRateLimit {
  private windowStart = -Infinity;
  private used = 0;
  private left?: SuppressedAudit;

  constructor(private readonly perSecond: number) {}

  /** Whether a line with this `result` may be written at `now` (epoch ms); counts it if not. */
  admit(result: string, now: number): boolean {
    if (now - this.windowStart >= 1000) {
      this.windowStart = now;
      this.used = 0;
    }
    if (this.used < this.perSecond) {
      this.used++;
      return true;
    }
    const left = (this.left ??= { suppressed: 0, results: {}, first: now, last: now });
    left.suppressed++;
    left.results[result] = (left.results[result] ?? 0) + 1;
    left.last = now;
    return false;
  }

  /** Whether lines were left out since the last {@link takeSuppressed}. */
  get hasSuppressed(): boolean {
    return this.left !== undefined;
  }

  /** What was left out since the last call, or `undefined` if nothing; resets the count. */
  takeSuppressed(): SuppressedAudit | undefined {
    const left = this.left;
    this.left = undefined;
    return left;
  }
}
