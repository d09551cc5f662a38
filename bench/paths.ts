import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

/** The directory holding package.json (the bench runs from `dist-dev/bench`). */
export function repoRoot(): string {
  let dir = __dirname;
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) return resolve(__dirname, '..');
    dir = parent;
  }
  return dir;
}

/**
 * The build the bench's brokers run: the production bundle `dist/main.js`, what the image ships
 * (`npm run bench` builds it first). `BENCH_BROKER_MAIN` names another (e.g. the dev build's
 * unbundled `dist-dev/src/main.js`, or an earlier commit's build in `.tmp/`) to compare.
 */
export function brokerMain(): string {
  return resolve(repoRoot(), process.env.BENCH_BROKER_MAIN ?? join('dist', 'main.js'));
}
