import { monitorEventLoopDelay } from 'node:perf_hooks';

/**
 * How late this test process ran, for timings taken in it. The provider emulator and the load
 * run in the Jest process, so the time the emulator stamps on a request is late by as long as
 * the process's event loop was stalled (a busy 2-core machine deschedules it): two stamps can
 * come closer together than the requests were sent. A bound on such a gap allows for the
 * longest stall measured while it was taken, no more.
 */
export function watchObserverLag(): { maxMs(): number; stop(): number } {
  const histogram = monitorEventLoopDelay({ resolution: RESOLUTION_MS });
  histogram.enable();
  // The histogram records each interval whole: what exceeds the resolution is the stall.
  const maxMs = () => Math.max(0, histogram.max / 1e6 - RESOLUTION_MS);
  return {
    /** The longest stall seen so far, in ms. */
    maxMs,
    /** Stops watching; the longest stall seen, in ms. */
    stop() {
      histogram.disable();
      return maxMs();
    },
  };
}

const RESOLUTION_MS = 10;
