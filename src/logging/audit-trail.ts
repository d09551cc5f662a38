import type { Logger } from 'pino';

interface SuppressedAudit {
  suppressed: number;
  /** Per result (e.g. a problem code). */
  results: Record<string, number>;
  /** Per authenticated caller (absent when none was). */
  callers?: Record<string, number>;
  /** Per client named (absent when none was). */
  clients?: Record<string, number>;
  /** Epoch ms. */
  first: number;
  last: number;
}

interface AuditedParty {
  caller?: string | undefined;
  client?: string | undefined;
}

/** Client names come from requests: a caller must not grow the report without bound. */
const MAX_NAMED = 20;
const OTHERS = '(others)';

/**
 * What every audit trail shares: its logger and name, and its refusal budget. At most
 * `refusalsPerSecond` refusal lines per second *per kind*; the rest are counted for a
 * `<trail> refusals suppressed` line every `intervalSeconds`, so a flood (credential stuffing, a
 * caller in a tight loop) cannot fill the disk, yet nothing vanishes without trace.
 * Unauthenticated refusals share one budget and each caller has its own, so anyone cannot push a
 * real caller's refusals out of the trail.
 */
export class AuditTrail {
  private readonly windows = new Map<string, { start: number; used: number }>();
  private left?: Omit<SuppressedAudit, 'callers' | 'clients'> & {
    // Maps: the names come from requests, and `__proto__` must stay a name.
    callers: Map<string, number>;
    clients: Map<string, number>;
  };
  private readonly perSecond: number;
  private readonly timer: NodeJS.Timeout;

  constructor(
    protected readonly logger: Logger,
    protected readonly trail: string,
    settings: { refusalsPerSecond: number; intervalSeconds: number },
  ) {
    this.perSecond = settings.refusalsPerSecond;
    this.timer = setInterval(() => this.flush(), settings.intervalSeconds * 1000);
    this.timer.unref();
  }

  /** `party.caller` is the name of an authenticated caller only. */
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

  /** Resets the count. */
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

  /** Writes what was suppressed since the last report as one line `<trail> refusals suppressed`. */
  protected reportSuppressed(): void {
    const left = this.takeSuppressed();
    if (left === undefined) return;
    const { first, last, ...counts } = left;
    this.logger.info(
      { ...counts, first: new Date(first).toISOString(), last: new Date(last).toISOString() },
      `${this.trail} refusals suppressed`,
    );
  }

  /** Every `intervalSeconds`: a trail that gathers lines writes them here, before the report. */
  flush(): void {
    this.reportSuppressed();
  }

  close(): void {
    clearInterval(this.timer);
    this.reportSuppressed();
  }
}

function count(counts: Map<string, number>, name: string): void {
  const key = counts.has(name) || counts.size < MAX_NAMED ? name : OTHERS;
  counts.set(key, (counts.get(key) ?? 0) + 1);
}
