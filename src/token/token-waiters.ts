import type { TokenRecord } from './token-record';

interface Waiter {
  /** Epoch ms the token must still be valid at. */
  needUntil: number;
  resolve: (r: TokenRecord) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * Callers waiting for a refresh in the mandatory window, each with the expiry its token must
 * reach ("need-until") and its own timeout. Holds no token itself: the state machine offers
 * tokens and decides what to tell the callers it cannot satisfy.
 */
export class TokenWaiters {
  private readonly waiters = new Set<Waiter>();

  get size(): number {
    return this.waiters.size;
  }

  /**
   * Waits for a token valid at least until `needUntil`. After `timeoutMs` the waiter leaves
   * the queue and is rejected with what `onTimeout` returns at that moment (the reason may
   * change while it waits).
   */
  wait(needUntil: number, timeoutMs: number, onTimeout: () => Error): Promise<TokenRecord> {
    return new Promise<TokenRecord>((resolve, reject) => {
      const waiter: Waiter = {
        needUntil,
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

  /** Whether `record` satisfies every waiter (true when none waits). */
  allMetBy(record: TokenRecord): boolean {
    for (const w of this.waiters) if (record.expiresAt < w.needUntil) return false;
    return true;
  }

  /**
   * Hands `record` to every waiter it satisfies. The others keep waiting, unless `refuse` is
   * given: then they are rejected with it (a freshly fetched token that still falls short
   * means no refresh could satisfy them).
   */
  offer(record: TokenRecord, refuse?: () => Error): void {
    for (const w of this.waiters) {
      if (record.expiresAt >= w.needUntil) {
        this.remove(w);
        w.resolve(record);
      } else if (refuse) {
        this.remove(w);
        w.reject(refuse());
      }
    }
  }

  /** Rejects every waiter with `err` and empties the queue. */
  rejectAll(err: Error): void {
    for (const w of this.waiters) {
      clearTimeout(w.timer);
      w.reject(err);
    }
    this.waiters.clear();
  }

  private remove(w: Waiter): void {
    clearTimeout(w.timer);
    this.waiters.delete(w);
  }
}
