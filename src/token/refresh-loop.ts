import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import { inSpan } from '../tracing/spans';
import type { FleetRefresh, RefreshPass } from './fleet-refresh';
import type { HeldToken } from './held-token';
import { RefreshAlarm } from './refresh-alarm';
import { isDue, MAX_TIMER_MS, MIN_SERVE_MS, refreshAt } from './refresh-schedule';
import type { RefreshStanding } from './refresh-standing';
import type { TokenRecord } from './token-record';
import type { TokenWaiters } from './token-waiters';

/** Collaborators of a {@link RefreshLoop}; the manager's own. */
export interface RefreshLoopDeps {
  refresh: FleetRefresh;
  held: HeldToken;
  standing: RefreshStanding;
  waiters: TokenWaiters;
  logger: Logger;
  refreshAheadMs: number;
  now: () => number;
  random: () => number;
  /** Catches up with the store's revocation generation (a pass read the store). */
  syncGeneration: () => void;
  /** Makes `record` the token held and answers the waiters (`fetched`: from the provider). */
  adopt: (record: TokenRecord, fetched: boolean) => void;
}

/**
 * The single flight of one client's refresh: at most one loop per process, started by the
 * refresh-ahead timer, by a caller in the mandatory window, by an invalidation, or by a store
 * event. Each pass is a {@link FleetRefresh}; between passes the loop sleeps for the backoff
 * {@link RefreshStanding} sets, or until a store event wakes it.
 */
export class RefreshLoop {
  private loop?: Promise<void>;
  private refreshTimer?: NodeJS.Timeout;
  /** The loop's sleep between passes, cut short by store events and shutdown. */
  private readonly alarm = new RefreshAlarm();
  /** Passes in a row that found the lock held elsewhere: the next short wait doubles. */
  private holderWaits = 0;
  private stoppedFlag = false;

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: RefreshLoopDeps,
  ) {}

  /** Whether a loop runs now. */
  get running(): boolean {
    return this.loop !== undefined;
  }

  /** Whether {@link stop} was called: no loop starts any more. */
  get stopped(): boolean {
    return this.stoppedFlag;
  }

  /** Starts the loop unless one runs (or the manager is stopping). */
  ensureRefreshing(reason: string): void {
    if (this.loop || this.stoppedFlag) return;
    this.deps.logger.debug({ client: this.client.id, reason }, 'token refresh started');
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      // A caller may have arrived with a stricter need while the loop was finishing.
      if (this.deps.waiters.size > 0 && !this.stoppedFlag && !this.deps.standing.failure?.permanent)
        this.ensureRefreshing('pending');
    });
  }

  /**
   * News for the loop (a store event): it re-reads now instead of at its next poll (asleep:
   * woken; inside a pass: it looks again once the pass ends).
   */
  ring(): void {
    this.alarm.ring();
  }

  /** Stops the timer and the retries; waits (bounded) for a pass in flight to finish. */
  async stop(timeoutMs: number): Promise<void> {
    this.stoppedFlag = true;
    clearTimeout(this.refreshTimer);
    // A loop sleeping between attempts ends now; one inside an attempt finishes it first.
    this.alarm.wakeIfAsleep();
    if (this.loop) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.loop,
        new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs))),
      ]);
      clearTimeout(timer);
    }
  }

  /** Re-arms the refresh-ahead timer for `record`. */
  schedule(record: TokenRecord): void {
    clearTimeout(this.refreshTimer);
    const { refreshAheadMs, random, now } = this.deps;
    const at = refreshAt(refreshAheadMs, record.obtainedAt, record.expiresAt, random);
    // Lifetimes are capped at a day, far below the timer's limit; clamp anyway, since a longer
    // delay would make setTimeout fire at once (a refresh loop).
    this.refreshTimer = setTimeout(
      () => this.ensureRefreshing('scheduled'),
      Math.min(MAX_TIMER_MS, Math.max(0, at - now())),
    );
    this.refreshTimer.unref();
  }

  private async runLoop(): Promise<void> {
    this.holderWaits = 0;
    while (!this.stoppedFlag) {
      let next: number | 'done';
      this.alarm.passStarted();
      try {
        const pass = await inSpan('token.refresh', { 'token_broker.client': this.client.id }, () =>
          this.deps.refresh.run({
            held: () => this.deps.held.current,
            goodEnough: (r) => this.isGoodEnough(r),
            failed: (err) => this.onAttemptFailed(err),
          }),
        );
        // The pass read the store: a revoke it learnt of drops what it must.
        this.deps.syncGeneration();
        next = this.afterPass(pass);
      } catch (err) {
        next = this.onAttemptFailed(err);
        this.deps.standing.hold(next);
      }
      // Done, or shutting down: no further attempt (stop() is waiting for this loop to end).
      if (next === 'done' || this.stoppedFlag) return;
      this.deps.standing.nextAttemptAt = this.deps.now() + next;
      await this.alarm.sleep(next);
    }
  }

  /** Acts on one pass: its token adopted (`'done'`), or how long until the next pass. */
  private afterPass(pass: RefreshPass): number | 'done' {
    const { standing } = this.deps;
    if (pass.kind === 'floor') {
      // A token was granted less than the floor ago: the callers it does not satisfy (a
      // min_ttl near the lifetime, or a lifetime too short) wait for the floor's end. Its
      // lifetime tells this replica what the provider grants, even if it was unusable.
      if (pass.lifetimeMs !== undefined) standing.noteLifetime(pass.lifetimeMs);
      standing.hold(pass.retryInMs, true);
      this.holderWaits = 0;
      return pass.retryInMs;
    }
    if (pass.kind === 'unusable') {
      // Granted, but too short-lived to hand out: neither stored nor served.
      standing.noteLifetime(pass.lifetimeMs);
      standing.hold(pass.retryInMs, true);
      this.holderWaits = 0;
      return pass.retryInMs;
    }
    if (pass.kind === 'wait') {
      // Another replica holds the lock: wait for its pub/sub message, re-read regardless.
      // The message may already have come during this pass: then re-read now.
      return this.alarm.wokenDuringPass ? 0 : Math.min(100 * 2 ** this.holderWaits++, 1000);
    }
    if (pass.kind !== 'token') {
      // Deferred or failed: no provider request before `retryInMs`.
      standing.hold(pass.retryInMs);
      // When the deferral ends the replicas race for the lock again: the losers must look
      // again soon, to learn the next deferral while their callers still wait.
      this.holderWaits = 0;
      return pass.retryInMs;
    }
    return this.takeToken(pass);
  }

  /** A pass brought a token: adopted (`'done'`), unless it is already outdated or refused. */
  private takeToken(pass: Extract<RefreshPass, { kind: 'token' }>): number | 'done' {
    const { held } = this.deps;
    // Requested before a revoke that arrived meanwhile: the fence refused it, and it is not
    // served either. Look again: the next pass asks in the new generation.
    if (!held.ofGeneration(pass.record)) return 0;
    // Refused by the provider after the pass judged it (the pass still awaited the lock's
    // release): adopting it would hand the rejected token straight back to the caller
    // retrying after its 401. Look again: the store no longer offers it.
    if (held.isRejected(pass.record.fingerprint)) return 0;
    if (pass.unshared) held.needsResync = true;
    this.deps.adopt(pass.record, pass.fetched);
    held.noteRefresh(pass.fetched ? 'fetched' : 'adopted');
    this.deps.standing.settle();
    return 'done';
  }

  /**
   * Whether `r` ends the refresh: outside its refresh window and enough for every waiter.
   * Judged by the token alone, not by "is it the one we hold": another path (a pub/sub wake-up,
   * a resync) may have adopted the fleet's new token while this pass was in flight, and the
   * pass must then stop instead of fetching one more.
   */
  private isGoodEnough(r: TokenRecord): boolean {
    const { held, now } = this.deps;
    if (held.isRejected(r.fingerprint)) return false;
    if (isDue(this.deps.refreshAheadMs, r.obtainedAt, r.expiresAt, now())) return false;
    return this.deps.waiters.allMetBy(r, now() + MIN_SERVE_MS);
  }

  /** Records a failed pass (see {@link RefreshStanding.failed}); how long to wait. */
  private onAttemptFailed(err: unknown): number {
    this.deps.held.noteRefresh('failed');
    return this.deps.standing.failed(err, this.deps.held.valid()?.expiresAt);
  }
}
