import { totalmem } from 'node:os';
import type { OrdersSettings } from '../config/config.schema';
import type { ForwardingProfile } from './forwarding.exception';

/** The share of the container's memory limit request bodies may take by default. */
export const BODY_BUDGET_FRACTION = 0.25;
/** The default budget where the process has no memory limit. */
export const BODY_BUDGET_FALLBACK_BYTES = 64 * 1024 * 1024;

/**
 * `ORDERS_BODY_BUDGET_BYTES`, or a quarter of the cgroup memory limit: a replica at its limit
 * is killed, so bodies must leave room for the heap, the answers and the runtime. Node reports
 * "no limit" as 0 or as a figure beyond the machine's memory, depending on the version.
 */
export function bodyBudgetBytes(
  configured: number,
  constrained: number = process.constrainedMemory(),
  machine: number = totalmem(),
): number {
  if (configured > 0) return configured;
  const limited = constrained > 0 && constrained < machine;
  return limited ? Math.floor(constrained * BODY_BUDGET_FRACTION) : BODY_BUDGET_FALLBACK_BYTES;
}

/** Why a request was refused; the route turns it into its problem. */
export type BudgetRefusal =
  | { readonly kind: 'in_flight'; readonly max: number }
  | { readonly kind: 'caller_bytes'; readonly max: number }
  | { readonly kind: 'replica_bytes'; readonly max: number };

/** What one request holds of the budgets, until {@link Hold.release}. */
export interface Hold {
  /** Takes `bytes` more of the body budgets; nothing is taken when it is refused. */
  reserve(this: void, bytes: number): BudgetRefusal | undefined;
  /** Idempotent: the request ended (answered, failed or aborted). */
  release(this: void): void;
}

export interface BudgetLimits {
  readonly maxInFlightPerCaller: Readonly<Record<ForwardingProfile, number>>;
  readonly bodyBytes: number;
  readonly callerBodyBytes: number;
}

export function budgetLimits(config: {
  orders: OrdersSettings;
  forward: { maxInFlightPerCaller: number };
}): BudgetLimits {
  const bodyBytes = bodyBudgetBytes(config.orders.bodyBudgetBytes);
  return {
    maxInFlightPerCaller: {
      orders: config.orders.maxInFlightPerCaller,
      forward: config.forward.maxInFlightPerCaller,
    },
    bodyBytes,
    callerBodyBytes: Math.max(
      1,
      Math.floor((bodyBytes * config.orders.bodyBudgetCallerPercent) / 100),
    ),
  };
}

/**
 * Per replica: requests in progress per (route, caller), and request body bytes held, in all
 * and per caller. Counted in memory, since what they protect is this process's memory; a
 * caller's entries go when its last request ends, so idle callers cost nothing.
 */
export class RequestBudgets {
  private readonly inFlight = new Map<string, number>();
  private readonly callerBytes = new Map<string, number>();
  private heldBytes = 0;

  constructor(readonly limits: BudgetLimits) {}

  /** Body bytes held by this replica now. */
  get bodyBytes(): number {
    return this.heldBytes;
  }

  /** Requests of `profile` in progress now, all callers together. */
  requests(profile: ForwardingProfile): number {
    let sum = 0;
    for (const [key, n] of this.inFlight) if (key.startsWith(`${profile}\u0000`)) sum += n;
    return sum;
  }

  /** A hold for one more request of `caller`, or why it may not start. */
  enter(profile: ForwardingProfile, caller: string): Hold | BudgetRefusal {
    const key = `${profile}\u0000${caller}`;
    const max = this.limits.maxInFlightPerCaller[profile];
    const running = this.inFlight.get(key) ?? 0;
    if (max > 0 && running >= max) return { kind: 'in_flight', max };
    this.inFlight.set(key, running + 1);
    let held = 0;
    let released = false;
    return {
      reserve: (bytes) => {
        if (released) return undefined;
        // The replica first: when it is full, no caller's share is the reason to name.
        if (this.heldBytes + bytes > this.limits.bodyBytes) {
          return { kind: 'replica_bytes', max: this.limits.bodyBytes };
        }
        const mine = this.callerBytes.get(caller) ?? 0;
        if (mine + bytes > this.limits.callerBodyBytes) {
          return { kind: 'caller_bytes', max: this.limits.callerBodyBytes };
        }
        this.callerBytes.set(caller, mine + bytes);
        this.heldBytes += bytes;
        held += bytes;
        return undefined;
      },
      release: () => {
        if (released) return;
        released = true;
        this.heldBytes -= held;
        const mine = (this.callerBytes.get(caller) ?? 0) - held;
        if (mine > 0) this.callerBytes.set(caller, mine);
        else this.callerBytes.delete(caller);
        const left = (this.inFlight.get(key) ?? 1) - 1;
        if (left > 0) this.inFlight.set(key, left);
        else this.inFlight.delete(key);
      },
    };
  }
}
