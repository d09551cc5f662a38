import { existsSync } from 'node:fs';

/** Debian's libfaketime (package `faketime`), the library behind the `faketime` command. */
export const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';

/**
 * Environment that runs a process with its clocks shifted by `offset` (libfaketime syntax:
 * `'+30s'`, `'-30s'`). Preloading the library directly rather than wrapping the command in
 * `faketime`: that command forks and waits, so stopping it by its pid would leave the broker
 * running; preloaded, the broker keeps its own pid.
 */
export function fakeClockEnv(offset: string): Record<string, string> {
  if (!existsSync(LIBFAKETIME)) {
    throw new Error(`${LIBFAKETIME} is missing: install Debian's "faketime" package`);
  }
  return { LD_PRELOAD: LIBFAKETIME, FAKETIME: offset };
}
