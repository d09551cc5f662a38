import type { TokenRecord } from './token-record';

interface Waiter {
  needUntil: number;
  /** The caller's `min_ttl` (ms; 0: none), for what it is told on refusal. */
  requestedMs: number;
  resolve: (r: TokenRecord) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/** Callers waiting in the mandatory window; the state machine offers tokens and refuses. */
export class TokenWaiters {
  private readonly waiters = new Set<Waiter>();

  get size(): number {
    return this.waiters.size;
  }

  /** On timeout, rejected with what `onTimeout` returns then: the reason may change. */
  wait(
    needUntil: number,
    timeoutMs: number,
    onTimeout: () => Error,
    requestedMs = 0,
  ): Promise<TokenRecord> {
    return new Promise<TokenRecord>((resolve, reject) => {
      const waiter: Waiter = {
        needUntil,
        requestedMs,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters.delete(waiter);
          reject(onTimeout());
        }, timeoutMs),
      };
      this.waiters.add(waiter);
    });
  }

  /** `servableUntil`: now plus the minimum left, which a waiter's older need may fall short of. */
  allMetBy(record: TokenRecord, servableUntil = 0): boolean {
    for (const w of this.waiters) if (!meets(record, w, servableUntil)) return false;
    return true;
  }

  /** With `refuse`, the others are rejected: a fresh token that falls short means none could do. */
  offer(record: TokenRecord, refuse?: (requestedMs: number) => Error, servableUntil = 0): void {
    for (const w of this.waiters) {
      if (meets(record, w, servableUntil)) {
        this.remove(w);
        w.resolve(record);
      } else if (refuse) {
        this.remove(w);
        w.reject(refuse(w.requestedMs));
      }
    }
  }

  rejectAll(err: Error | ((requestedMs: number) => Error)): void {
    for (const w of this.waiters) {
      clearTimeout(w.timer);
      w.reject(typeof err === 'function' ? err(w.requestedMs) : err);
    }
    this.waiters.clear();
  }

  private remove(w: Waiter): void {
    clearTimeout(w.timer);
    this.waiters.delete(w);
  }
}

function meets(record: TokenRecord, w: Waiter, servableUntil: number): boolean {
  return record.expiresAt >= Math.max(w.needUntil, servableUntil);
}
