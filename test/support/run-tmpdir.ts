import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

/**
 * Jest's globalSetup and globalTeardown: the whole run, and every broker, emulator and
 * redis-server it starts, makes its temporary files under one folder of its own, removed when
 * the run ends, so no test credentials or Redis data stay in the machine's /tmp, whatever a
 * suite forgets or an interrupted test skips. os.tmpdir() reads TMPDIR on each call and child
 * processes inherit it.
 */
const KEY = 'TOKEN_BROKER_TEST_RUN_TMPDIR';

export function setupRunTmpdir(): void {
  const dir = mkdtempSync(join(tmpdir(), 'tb-run-'));
  process.env[KEY] = dir;
  process.env.TMPDIR = dir;
}

export function teardownRunTmpdir(): void {
  const dir = process.env[KEY];
  if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
}

/**
 * The machine's temporary folder, outside the run's 0700 one: for a suite whose files another
 * user must reach (it removes them itself).
 */
export function machineTmpdir(): string {
  const dir = process.env[KEY];
  return dir === undefined ? tmpdir() : dirname(dir);
}
