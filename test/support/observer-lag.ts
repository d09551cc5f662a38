import { monitorEventLoopDelay } from 'node:perf_hooks';

/**
 * How late this test process ran, for timings taken in it. The provider emulator and the load
 * run in the Jest process, so the time the emulator stamps on a request is late by as long as
 * the process's event loop was stalled (a busy 2-core machine deschedules it): two stamps can
 * come closer together than the requests were sent. A bound on such a gap allows for the
 * longest stall measured while it was taken, no more.
 */
export function watchObserverLag(): { stop(): number } {
  const histogram = monitorEventLoopDelay({ resolution: 10 });
  histogram.enable();
  return {
    /** Stops watching; the longest stall seen beyond the sampling interval, in ms. */
    stop() {
      histogram.disable();
      return Math.max(0, histogram.max / 1e6 - 10);
    },
  };
}
