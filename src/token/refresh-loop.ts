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

interface RefreshLoopDeps {
  refresh: FleetRefresh;
  held: HeldToken;
  standing: RefreshStanding;
  waiters: TokenWaiters;
  logger: Logger;
  refreshAheadMs: number;
  now: () => number;
  random: () => number;
  syncGeneration: () => void;
  /** `fetched`: from the provider. */
  adopt: (record: TokenRecord, fetched: boolean) => void;
}

/**
 * The single flight of one client's refresh: at most one loop per process; between passes it
 * sleeps for the backoff {@link RefreshStanding} sets, or until a store event wakes it.
 */
export class RefreshLoop {
  private loop?: Promise<void>;
  private refreshTimer?: NodeJS.Timeout;
  private readonly alarm = new RefreshAlarm();
  /** Passes in a row that found the lock held elsewhere: the next short wait doubles. */
  private holderWaits = 0;
  private stoppedFlag = false;

  constructor(
    private readonly client: ClientConfig,
    private readonly deps: RefreshLoopDeps,
  ) {}

  get running(): boolean {
    return this.loop !== undefined;
  }

  get stopped(): boolean {
    return this.stoppedFlag;
  }

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

  /** A store event: re-read now (asleep: woken; inside a pass: once the pass ends). */
  ring(): void {
    this.alarm.ring();
  }

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

  schedule(record: TokenRecord): void {
    clearTimeout(this.refreshTimer);
    const { refreshAheadMs, random, now } = this.deps;
    const at = refreshAt(refreshAheadMs, record.obtainedAt, record.expiresAt, random);
    // Clamped: a delay over the timer's limit makes setTimeout fire at once (a refresh loop).
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
      if (next === 'done' || this.stoppedFlag) return;
      this.deps.standing.nextAttemptAt = this.deps.now() + next;
      await this.alarm.sleep(next);
    }
  }

  private afterPass(pass: RefreshPass): number | 'done' {
    if (pass.kind === 'token') return this.takeToken(pass);
    if (pass.kind === 'wait') {
      // Another replica holds the lock: wait for its message, or re-read now if it came already.
      return this.alarm.wokenDuringPass ? 0 : Math.min(100 * 2 ** this.holderWaits++, 1000);
    }
    // A floor's lifetime tells this replica what the provider grants, even if it was unusable.
    if ('lifetimeMs' in pass && pass.lifetimeMs !== undefined) {
      this.deps.standing.noteLifetime(pass.lifetimeMs);
    }
    this.deps.standing.hold(pass.retryInMs, pass.kind === 'floor' || pass.kind === 'unusable');
    // When a hold ends the replicas race for the lock again: the losers look again soon.
    this.holderWaits = 0;
    return pass.retryInMs;
  }

  private takeToken(pass: Extract<RefreshPass, { kind: 'token' }>): number | 'done' {
    const { held } = this.deps;
    // Requested before a revoke that arrived meanwhile: the next pass asks in the new generation.
    if (!held.ofGeneration(pass.record)) return 0;
    // Refused by the provider after the pass judged it: adopting it would hand the rejected
    // token straight back to the caller retrying after its 401.
    if (held.isRejected(pass.record.fingerprint)) return 0;
    if (pass.unshared) held.needsResync = true;
    this.deps.adopt(pass.record, pass.fetched);
    held.noteRefresh(pass.fetched ? 'fetched' : 'adopted');
    this.deps.standing.settle();
    return 'done';
  }

  /**
   * Judged by the token alone, not "is it the one we hold": another path may have adopted the
   * fleet's new token meanwhile, and the pass must then stop instead of fetching one more.
   */
  private isGoodEnough(r: TokenRecord): boolean {
    const { held, now } = this.deps;
    if (held.isRejected(r.fingerprint)) return false;
    if (isDue(this.deps.refreshAheadMs, r.obtainedAt, r.expiresAt, now())) return false;
    return this.deps.waiters.allMetBy(r, now() + MIN_SERVE_MS);
  }

  private onAttemptFailed(err: unknown): number {
    this.deps.held.noteRefresh('failed');
    return this.deps.standing.failed(err, this.deps.held.valid()?.expiresAt);
  }
}
