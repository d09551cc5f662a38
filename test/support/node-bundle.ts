import { join } from 'node:path';
import { buildSync } from 'esbuild';
import { repoRoot } from './repo-root';

/**
 * `contents`, TypeScript importing from `src/`, bundled by esbuild into `outfile` for a plain
 * node process (Nest 12 is ES modules only, which Jest's CommonJS runtime cannot load), its
 * dependencies left to `require` from node_modules: no prior build needed.
 */
export function bundleForNode(contents: string, outfile: string): void {
  const root = repoRoot();
  buildSync({
    stdin: { contents, resolveDir: join(root, 'src'), sourcefile: 'entry.ts', loader: 'ts' },
    tsconfig: join(root, 'tsconfig.json'),
    bundle: true,
    packages: 'external',
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    outfile,
    logLevel: 'error',
  });
}
