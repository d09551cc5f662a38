/** What {@link AuditRateLimit} left out since its last report. */
export interface SuppressedAudit {
  /** Lines left out. */
  suppressed: number;
  /** Lines left out per result (e.g. a problem code). */
  results: Record<string, number>;
  /** Lines left out per authenticated caller (absent when none was). */
  callers?: Record<string, number>;
  /** Lines left out per client they named (absent when none did). */
  clients?: Record<string, number>;
  /** Epoch ms of the first and the last line left out. */
  first: number;
  last: number;
}

/** Whose refusal a line is: the authenticated caller's name, the client it named. */
export interface AuditedParty {
  caller?: string | undefined;
  client?: string | undefined;
}

/**
 * Distinct callers or clients counted by name in one report; the rest are counted under
 * {@link OTHERS}. Client names come from requests, so an authenticated caller must not be able
 * to grow the report (or the memory behind it) without bound.
 */
const MAX_NAMED = 20;
const OTHERS = '(others)';

/**
 * At most `perSecond` individual audit lines in any one-second window *per kind*; the rest are
 * counted, and {@link takeSuppressed} says how many (per result, caller and client) so a later
 * line can report them.
 *
 * Why: refusals (bad credentials, forbidden clients, bad input) stay one line each, so an
 * investigation sees every request id, but a flood of them (a credential-stuffing script, a
 * misconfigured caller in a tight loop) must not fill the node's disk or drown the other logs.
 * Nothing disappears without trace: every suppressed line is counted in a summary line.
 *
 * The kinds: refusals of no authenticated caller share one budget, and each authenticated caller
 * has its own. Anyone can send unauthenticated requests, so they must not be able to push a real
 * caller's refusal out of the trail; one caller's loop must not push out another's either. The
 * number of budgets is bounded by the callers configured.
 */
export class AuditRateLimit {
  private readonly windows = new Map<string, { start: number; used: number }>();
  private left?: Omit<SuppressedAudit, 'callers' | 'clients'> & {
    // Maps: the names come from requests, and `__proto__` must stay a name.
    callers: Map<string, number>;
    clients: Map<string, number>;
  };

  constructor(private readonly perSecond: number) {}

  /**
   * Whether a line with this `result` of `party` may be written at `now` (epoch ms); counts it
   * if not. `party.caller` is the name of an authenticated caller only.
   */
  admit(result: string, now: number, party: AuditedParty = {}): boolean {
    const kind = party.caller === undefined ? '' : `caller:${party.caller}`;
    let window = this.windows.get(kind);
    if (window === undefined || now - window.start >= 1000) {
      window = { start: now, used: 0 };
      this.windows.set(kind, window);
    }
    if (window.used < this.perSecond) {
      window.used++;
      return true;
    }
    const left = (this.left ??= {
      suppressed: 0,
      results: {},
      callers: new Map<string, number>(),
      clients: new Map<string, number>(),
      first: now,
      last: now,
    });
    left.suppressed++;
    left.results[result] = (left.results[result] ?? 0) + 1;
    if (party.caller !== undefined) count(left.callers, party.caller);
    if (party.client !== undefined) count(left.clients, party.client);
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
    if (left === undefined) return undefined;
    const { callers, clients, ...counts } = left;
    return {
      ...counts,
      ...(callers.size > 0 && { callers: Object.fromEntries(callers) }),
      ...(clients.size > 0 && { clients: Object.fromEntries(clients) }),
    };
  }
}

function count(counts: Map<string, number>, name: string): void {
  const key = counts.has(name) || counts.size < MAX_NAMED ? name : OTHERS;
  counts.set(key, (counts.get(key) ?? 0) + 1);
}
