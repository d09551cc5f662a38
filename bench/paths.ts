import { join, resolve } from 'node:path';
import { repoRoot } from '../test/support/repo-root';

/**
 * The build the bench's brokers run: the production bundle `dist/main.js`, what the image ships
 * (`npm run bench` builds it first). `BENCH_BROKER_MAIN` names another (e.g. the dev build's
 * unbundled `dist-dev/src/main.js`, or an earlier commit's build in `.tmp/`) to compare.
 */
export function brokerMain(): string {
  return resolve(repoRoot(), process.env.BENCH_BROKER_MAIN ?? join('dist', 'main.js'));
}
