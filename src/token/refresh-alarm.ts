/**
 * The refresh loop's sleep, cut short by a store event or shutdown. News that arrives during a
 * pass is kept, so the loop looks again at once instead of sleeping on it.
 */
export class RefreshAlarm {
  private wake?: () => void;
  /** The pass may have read the store before the news. */
  private newsDuringPass = false;

  passStarted(): void {
    this.newsDuringPass = false;
  }

  get wokenDuringPass(): boolean {
    return this.newsDuringPass;
  }

  ring(): void {
    if (this.wake) this.wake();
    else this.newsDuringPass = true;
  }

  /** Shutdown: nothing is kept for a pass in flight. */
  wakeIfAsleep(): void {
    this.wake?.();
  }

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
