import { execFile } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

/**
 * The module boundaries of issue #11, proven two ways:
 *
 * - the folder graph of `src/` (non-spec files) has no cycle;
 * - the lint rule that keeps it so (`no-restricted-imports` overrides in `eslint.config.mjs`,
 *   run by `npm run lint`) refuses each kind of forbidden import and lets the allowed ones
 *   through. ESLint runs in a child process, as `npm run lint` does, on probe sources linted as
 *   if they were real files of each folder.
 */

const ROOT = resolve(__dirname, '..');
const SRC = join(ROOT, 'src');
const run = promisify(execFile);

/** `folder -> imported folders` for every non-spec file under `src/<folder>/`. */
function folderGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const folder of readdirSync(SRC, { withFileTypes: true }).filter((e) => e.isDirectory())) {
    const targets = new Set<string>();
    for (const file of readdirSync(join(SRC, folder.name))) {
      if (!file.endsWith('.ts') || file.endsWith('.spec.ts')) continue;
      const text = readFileSync(join(SRC, folder.name, file), 'utf8');
      for (const m of text.matchAll(/from '\.\.\/([a-z-]+)\//g)) targets.add(m[1]);
    }
    graph.set(folder.name, [...targets]);
  }
  return graph;
}

/** One cycle in `edges` as a path `[a, b, ..., a]`, or undefined. */
function findCycle(edges: Map<string, string[]>): string[] | undefined {
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (node: string): string[] | undefined => {
    if (state.get(node) === 'open') return [...path.slice(path.indexOf(node)), node];
    if (state.get(node) === 'done') return undefined;
    state.set(node, 'open');
    path.push(node);
    for (const next of edges.get(node) ?? []) {
      const cycle = visit(next);
      if (cycle) return cycle;
    }
    path.pop();
    state.set(node, 'done');
    return undefined;
  };
  for (const node of edges.keys()) {
    const cycle = visit(node);
    if (cycle) return cycle;
  }
  return undefined;
}

interface Probe {
  /** The file the probe is linted as (an existing file, so the type-aware parser knows it). */
  as: string;
  /** Import sources, one per line; the expectation lists which lines are refused. */
  imports: string[];
  refused: string[];
}

const PROBES: Probe[] = [
  {
    as: 'src/forwarding/forwarding.constants.ts',
    imports: [
      '../redis/idempotency-store.redis',
      '../redis/redis.module',
      '../token/token.service',
      '../provider/provider-api.client',
    ],
    refused: ['../redis/idempotency-store.redis', '../redis/redis.module'],
  },
  {
    as: 'src/token/token-record.ts',
    imports: ['../redis/redis.module', '../forwarding/forwarding.service', '../caller-auth/caller'],
    refused: ['../redis/redis.module', '../forwarding/forwarding.service'],
  },
  {
    as: 'src/redis/redis.constants.ts',
    imports: [
      '../token/token.service',
      '../token/token-store',
      '../forwarding/forwarding.service',
      '../forwarding/idempotency-store',
    ],
    refused: ['../token/token.service', '../forwarding/forwarding.service'],
  },
  {
    as: 'src/http/request-id.ts',
    imports: ['../token/token.service', '../token/token.exception', '../metrics/metrics.service'],
    refused: ['../token/token.service', '../token/token.exception', '../metrics/metrics.service'],
  },
  {
    as: 'src/caller-auth/caller.ts',
    imports: ['../token/token.service', '../http/problem', '../http/request.exception'],
    refused: ['../token/token.service', '../http/problem'],
  },
  {
    as: 'src/provider/provider.constants.ts',
    imports: [
      '../forwarding/forwarding.service',
      '../token/token.exception',
      '../secrets/secret-reader',
    ],
    refused: ['../forwarding/forwarding.service', '../token/token.exception'],
  },
  {
    as: 'src/config/config.constants.ts',
    imports: [
      '../../emulator/provider-emulator',
      '../../test/support/ports',
      '../errors/broker.exception',
    ],
    refused: ['../../emulator/provider-emulator', '../../test/support/ports'],
  },
  {
    // Specs wire real adapters on purpose: exempt.
    as: 'src/forwarding/order-request.spec.ts',
    imports: ['../redis/idempotency-store.redis'],
    refused: [],
  },
];

/** Lints every probe in one ESLint process; returns the refused import sources per probe. */
async function lintProbes(probes: Probe[]): Promise<string[][]> {
  const script = `
    const { ESLint } = require('eslint');
    const probes = JSON.parse(process.argv[1]);
    (async () => {
      const eslint = new ESLint({ cwd: process.cwd() });
      const out = [];
      for (const p of probes) {
        const code = p.imports.map((s, i) => "import type * as m" + i + " from '" + s + "';").join('\\n');
        const [result] = await eslint.lintText(code + '\\n', { filePath: p.as });
        out.push(result.messages
          .filter((m) => m.ruleId === 'no-restricted-imports')
          .map((m) => p.imports[m.line - 1]));
      }
      process.stdout.write(JSON.stringify(out));
    })().catch((err) => { console.error(err); process.exit(1); });
  `;
  const { stdout } = await run(process.execPath, ['-e', script, JSON.stringify(probes)], {
    cwd: ROOT,
    maxBuffer: 16 * 1024 * 1024,
  });
  return JSON.parse(stdout) as string[][];
}

describe('module boundaries', () => {
  it('src/ has no folder cycle', () => {
    expect(findCycle(folderGraph())).toBeUndefined();
  });

  it('finds a cycle when there is one (the check above can fail)', () => {
    expect(
      findCycle(
        new Map([
          ['orders', ['token', 'redis']],
          ['redis', ['orders']],
          ['token', []],
        ]),
      ),
    ).toEqual(['orders', 'redis', 'orders']);
  });

  it('the lint rule refuses forbidden imports per folder and allows the rest', async () => {
    const refused = await lintProbes(PROBES);
    expect(PROBES.map((p, i) => ({ as: p.as, refused: refused[i] }))).toEqual(
      PROBES.map((p) => ({ as: p.as, refused: p.refused })),
    );
  }, 120_000);
});
