/** Options for {@link waitFor}. */
export interface WaitOptions {
  /** Give up after this long; the error names {@link WaitOptions.what}. */
  timeoutMs: number;
  /**
   * Pause between two probes.
   * @default 20
   */
  intervalMs?: number;
  /** What is awaited, for the timeout message ("the store to recover"). */
  what: string;
  /**
   * Stops waiting early, rejecting with the signal's reason: for conditions that can become
   * impossible (the process being polled has exited), so the caller fails now rather than at
   * the deadline.
   */
  signal?: AbortSignal;
}

/**
 * Polls `probe` until it returns a truthy value, and returns that value.
 *
 * A probe that throws or rejects counts as "not yet" (a server that is still starting refuses
 * connections); the last such error is attached to the timeout error as `cause` and quoted in
 * its message, because "timed out" alone rarely says why. A probe that hangs does not stretch
 * the deadline: each call is raced against the time left.
 *
 * @throws Error `timed out after <timeoutMs>ms waiting for <what>` at the deadline.
 */
export async function waitFor<T>(
  probe: () => T | Promise<T>,
  opts: WaitOptions,
): Promise<NonNullable<T>> {
  const intervalMs = opts.intervalMs ?? 20;
  const deadline = Date.now() + opts.timeoutMs;
  let lastError: unknown;
  let hasError = false;
  for (;;) {
    throwIfAborted(opts.signal);
    try {
      const value = await raceDeadline(probe, deadline, opts.signal);
      if (value !== TIMED_OUT && value) return value;
    } catch (err) {
      // An abort is final; anything else is the condition not holding yet.
      if (opts.signal?.aborted) throw abortReason(opts.signal);
      lastError = err;
      hasError = true;
    }
    const left = deadline - Date.now();
    if (left <= 0) {
      const suffix = hasError ? `; last error: ${describe(lastError)}` : '';
      throw new Error(`timed out after ${opts.timeoutMs}ms waiting for ${opts.what}${suffix}`, {
        cause: hasError ? lastError : undefined,
      });
    }
    await pause(Math.min(intervalMs, left), opts.signal);
  }
}

/**
 * Resolves after `ms`. Only for deliberate pacing (spreading requests over time, holding a
 * fault for a while); to wait for a condition use {@link waitFor}, since a fixed sleep is
 * either too short on a slow machine or wastes time on a fast one.
 */
export async function delay(ms: number): Promise<void> {
  return new Promise<void>((resolve) => setTimeout(resolve, ms));
}

const TIMED_OUT = Symbol('timed out');

async function raceDeadline<T>(
  probe: () => T | Promise<T>,
  deadline: number,
  signal: AbortSignal | undefined,
): Promise<T | typeof TIMED_OUT> {
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      Promise.resolve().then(probe),
      new Promise<typeof TIMED_OUT>((resolve, reject) => {
        timer = setTimeout(() => resolve(TIMED_OUT), Math.max(0, deadline - Date.now()));
        if (signal) {
          onAbort = () => reject(abortReason(signal));
          signal.addEventListener('abort', onAbort, { once: true });
        }
      }),
    ]);
  } finally {
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener('abort', onAbort);
  }
}

async function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    function onAbort(this: AbortSignal) {
      clearTimeout(timer);
      reject(abortReason(this));
    }
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortReason(signal);
}

function abortReason(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  return reason instanceof Error ? reason : new Error(`aborted: ${describe(reason)}`);
}

function describe(err: unknown): string {
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}
