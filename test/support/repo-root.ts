import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

/**
 * The directory holding package.json. Walking up rather than a fixed `../..` because the test
 * helpers and the bench also run compiled, from `dist-dev/` (`npm run bench`).
 */
export function repoRoot(): string {
  let dir = __dirname;
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) return resolve(__dirname, '../..');
    dir = parent;
  }
  return dir;
}
