import type { TokenRecord } from './token-record';

interface Waiter {
  /** Epoch ms the token must still be valid at. */
  needUntil: number;
  /** The caller's own `min_ttl` (ms; 0 when it sent none), for what it is told on refusal. */
  requestedMs: number;
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

  /**
   * Whether `record` satisfies every waiter (true when none waits). `servableUntil`: the
   * expiry a token needs to be handed out at all now (now plus the minimum left), which a
   * waiter's older need-until may fall short of.
   */
  allMetBy(record: TokenRecord, servableUntil = 0): boolean {
    for (const w of this.waiters) if (!meets(record, w, servableUntil)) return false;
    return true;
  }

  /**
   * Hands `record` to every waiter it satisfies. The others keep waiting, unless `refuse` is
   * given: then they are rejected with it (a freshly fetched token that still falls short
   * means no refresh could satisfy them).
   */
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

  /**
   * Rejects every waiter with `err` (or what it returns for the waiter's own `min_ttl`) and
   * empties the queue.
   */
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
