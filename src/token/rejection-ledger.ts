import type { RejectionRule } from './token-store';

/**
 * The rejection floor and the callers' budgets kept in one process: the memory store's, and a
 * replica's own while the shared store does not answer. Entries are per configured client and
 * caller, so the maps stay as small as the configuration.
 */
export class RejectionLedger {
  private readonly floorUntil = new Map<string, number>();
  private readonly spent = new Map<string, { count: number; until: number }>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Whether an invalidation may go ahead; if it may, it is counted and starts the floor. */
  admit(clientId: string, rule: RejectionRule): 'ok' | 'floored' | 'caller_budget' {
    const now = this.now();
    if ((this.floorUntil.get(clientId) ?? 0) > now) return 'floored';
    if (rule.perCaller > 0) {
      const key = `${clientId}\n${rule.caller}`;
      const prior = this.spent.get(key);
      const current = prior !== undefined && prior.until > now ? prior : undefined;
      if ((current?.count ?? 0) >= rule.perCaller) return 'caller_budget';
      this.spent.set(key, {
        count: (current?.count ?? 0) + 1,
        until: current?.until ?? now + rule.windowMs,
      });
    }
    this.floorUntil.set(clientId, now + rule.floorMs);
    return 'ok';
  }
}
