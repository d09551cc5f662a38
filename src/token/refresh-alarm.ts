/**
 * The refresh loop's sleep between passes, cut short by news: a store event (another replica
 * wrote a token) or shutdown. News that arrives while the loop is inside a pass, not asleep,
 * is kept, so the loop looks again at once instead of sleeping on a wake-up it already had.
 */
export class RefreshAlarm {
  private wake?: () => void;
  /**
   * News arrived while the loop was inside a pass: the pass may have read the store before
   * it, so the loop must look again at once.
   */
  private newsDuringPass = false;

  /** A pass begins: news from before it is in what it reads. */
  passStarted(): void {
    this.newsDuringPass = false;
  }

  /** Whether news arrived since the pass began. */
  get wokenDuringPass(): boolean {
    return this.newsDuringPass;
  }

  /** News for the loop: wakes it if asleep, else it looks again once the pass ends. */
  ring(): void {
    if (this.wake) this.wake();
    else this.newsDuringPass = true;
  }

  /** Ends a sleep in progress (shutdown); nothing is kept for a pass in flight. */
  wakeIfAsleep(): void {
    this.wake?.();
  }

  /** Sleeps for `ms`, or less if {@link ring} or {@link wakeIfAsleep} wakes the loop. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        // Awake: a later event must not be spent on this finished sleep.
        if (this.wake === done) this.wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wake = done;
    });
  }
}
