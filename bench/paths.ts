import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import {
  type BrokerProcess,
  spawnBroker,
  type SpawnBrokerOptions,
} from '../test/support/broker-process';
import { envOf, globalArgs, parseDockerfile } from '../test/support/dockerfile';
import { repoRoot } from '../test/support/repo-root';

/**
 * The build the bench's brokers run: the production bundle `dist/main.js`, what the image ships
 * (`npm run bench` builds it first). `BENCH_BROKER_MAIN` names another (e.g. the dev build's
 * unbundled `dist-dev/src/main.js`, or an earlier commit's build in `.tmp/`) to compare.
 */
export function brokerMain(): string {
  return resolve(repoRoot(), process.env.BENCH_BROKER_MAIN ?? join('dist', 'main.js'));
}

let image: { major: string; path: string } | null | undefined;

/**
 * The Node the image runs (the Dockerfile's `ARG NODE_IMAGE=node:<major>`): this one when the major
 * matches, else the one the tests installed under `.tmp/`, else npm's `node@<major>` through npx.
 * `null` when the Dockerfile names none.
 */
export function imageNode(): { major: string; path: string } | null {
  if (image !== undefined) return image;
  const dockerfile = readFileSync(join(repoRoot(), 'Dockerfile'), 'utf8');
  const major = /^node:(\d+)/.exec(globalArgs(dockerfile).get('NODE_IMAGE') ?? '')?.[1];
  if (major === undefined) return (image = null);
  const installed = join(repoRoot(), '.tmp', `node-${major}`, 'node_modules', '.bin', 'node');
  const path =
    major === process.versions.node.split('.')[0]
      ? process.execPath
      : existsSync(installed)
        ? installed
        : execFileSync('npx', ['-y', `node@${major}`, '-p', 'process.execPath'], {
            encoding: 'utf8',
            stdio: ['ignore', 'pipe', 'ignore'],
          }).trim();
  return (image = { major, path });
}

let runtime: { nodeArgs: string[]; env: Record<string, string> } | undefined;

/**
 * How the image starts the broker, from the Dockerfile's last stage: Node's flags in its `CMD`
 * (`["node", <flags>, "dist/main.js"]`) and its `ENV`, so the bench's replicas run with the
 * image's heap and allocator settings (`test/runtime-stage.e2e-spec.ts` replays the same stage).
 */
export function imageRuntime(): { nodeArgs: string[]; env: Record<string, string> } {
  if (runtime !== undefined) return runtime;
  const stages = parseDockerfile(readFileSync(join(repoRoot(), 'Dockerfile'), 'utf8'));
  const env: Record<string, string> = {};
  let argv: string[] = [];
  for (const { op, args } of stages[stages.length - 1]?.instructions ?? []) {
    if (op === 'ENV') Object.assign(env, envOf(args));
    if (op === 'CMD') argv = JSON.parse(args) as string[];
  }
  const nodeArgs = argv.slice(1, -1).filter((a) => a.startsWith('--'));
  return (runtime = { nodeArgs, env });
}

/**
 * {@link brokerMain} started as the image starts it ({@link imageRuntime}: its `CMD`'s Node flags,
 * its `ENV` under `opts.env`): every bench section's brokers.
 */
export function spawnImageBroker(
  opts: Omit<SpawnBrokerOptions, 'script' | 'nodeArgs'>,
): Promise<BrokerProcess> {
  const { nodeArgs, env } = imageRuntime();
  return spawnBroker({ ...opts, script: brokerMain(), nodeArgs, env: { ...env, ...opts.env } });
}
