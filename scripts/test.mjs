// Runs Jest (arguments passed on) on a Node that can load the app inside the Jest process.
// Given test paths, one Jest run of those; given none, the whole suite (see runInPhases).
//
// NestJS 12 ships ES modules only. Jest's CommonJS runtime require()s them natively from Node
// 24.9 on, with `--experimental-vm-modules`; before that nothing can run the app in-process.
// On an older Node this script re-runs itself on the Docker image's Node major (the
// `ARG NODE_IMAGE=node:<major>` of the Dockerfile), installed under .tmp/node-<major> as `.ci/run` does.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
/** Above this, Jest replaces a worker once its suite ends (`workerIdleMemoryLimit`). */
const WORKER_MEMORY_LIMIT = '400MB';
/** A suite's header line ` * @alone` or ` * @timed` (see runInPhases). */
const MARKER = /^\s*\*\s*@(alone|timed)\b/m;

/** Runs `command` to completion with inherited stdio and exits with its status. */
function runAndExit(command, argv, env) {
  const result = spawnSync(command, argv, { stdio: 'inherit', env, cwd: root });
  if (result.error) throw result.error;
  process.exit(result.status ?? 1);
}

const [major, minor] = process.versions.node.split('.').map(Number);
if (major > 24 || (major === 24 && minor >= 9)) {
  const nodeOptions = [
    process.env.NODE_OPTIONS,
    '--experimental-vm-modules',
    // Jest's own notice that VM modules are experimental, once per worker: known and accepted.
    '--disable-warning=ExperimentalWarning',
  ]
    .filter(Boolean)
    .join(' ');
  const jest = createRequire(join(root, 'package.json')).resolve('jest/bin/jest');
  const env = { ...process.env, NODE_OPTIONS: nodeOptions };
  if (args.some((a) => !a.startsWith('-'))) runAndExit(process.execPath, [jest, ...args], env);
  process.exit(
    runInPhases(
      (argv) =>
        spawnSync(process.execPath, [jest, ...argv], { stdio: 'inherit', env, cwd: root }).status ??
        1,
    ),
  );
}

const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8');
const imageMajor = /^ARG NODE_IMAGE=node:(\d+)/m.exec(dockerfile)?.[1];
if (imageMajor === undefined) {
  throw new Error(
    `Node ${process.versions.node} cannot run the app inside Jest (needs >= 24.9), and the ` +
      'Dockerfile names no `ARG NODE_IMAGE=node:<major>` to use instead',
  );
}
const prefix = join(root, '.tmp', `node-${imageMajor}`);
const bin = join(prefix, 'node_modules', '.bin');
if (!existsSync(join(bin, 'node'))) {
  console.error(
    `Node ${process.versions.node} is too old for the tests; installing node@${imageMajor}`,
  );
  const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
  const install = spawnSync(
    npm,
    [
      'install',
      '--prefix',
      prefix,
      '--no-save',
      '--no-audit',
      '--no-package-lock',
      `node@${imageMajor}`,
    ],
    { stdio: ['ignore', 'ignore', 'inherit'], cwd: root },
  );
  if (install.status !== 0) process.exit(install.status ?? 1);
}
// The image's Node first on PATH too, so the brokers the tests spawn (process.execPath) and any
// `node` they start by name run on it.
runAndExit(join(bin, 'node'), [fileURLToPath(import.meta.url), ...args], {
  ...process.env,
  PATH: `${bin}${delimiter}${process.env.PATH ?? ''}`,
});

/**
 * The whole suite (no test path given), in three phases: the suites that do not time anything
 * on two workers; then those marked `@timed` on two workers, beside no other kind of suite
 * (they time brokers under a load that leaves room for one more such suite); then those marked
 * `@alone` one after another (their load takes both cores, so a second suite beside them would
 * be part of what they measure). Jest replaces a worker that holds more than
 * WORKER_MEMORY_LIMIT after a suite: in one long-lived heap the collector's pauses grew to
 * seconds, and the emulator and the load generators run in that process. `--outputFile=<f>`
 * gets the runs' JSON results as one.
 */
function runInPhases(jest) {
  const output = args.find((a) => a.startsWith('--outputFile='))?.slice('--outputFile='.length);
  const rest = args.filter((a) => !a.startsWith('--outputFile='));
  const marked = markedSuites();
  const timed = marked.filter((m) => m.kind === 'timed').map((m) => m.path);
  const alone = marked.filter((m) => m.kind === 'alone').map((m) => m.path);
  const phases = [
    [
      'shared',
      [
        '--maxWorkers=2',
        '--testPathIgnorePatterns',
        '/node_modules/',
        ...marked.map((m) => escape(m.path)),
      ],
    ],
    ['timed', ['--maxWorkers=2', '--runTestsByPath', ...timed]],
    ['alone', ['--maxWorkers=1', '--runTestsByPath', ...alone]],
  ].filter(([name, argv]) => name === 'shared' || argv.length > 2);
  const statuses = phases.map(([name, argv]) =>
    jest([
      ...argv,
      `--workerIdleMemoryLimit=${WORKER_MEMORY_LIMIT}`,
      ...rest,
      ...(output ? [`--outputFile=${output}.${name}`] : []),
    ]),
  );
  if (output)
    mergeResults(
      phases.map(([name]) => `${output}.${name}`),
      output,
    );
  return statuses.every((s) => s === 0) ? 0 : 1;
}

/** `path` as a regular expression matching itself. */
function escape(path) {
  return path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Test files whose header has a line ` * @alone` or ` * @timed`, with which. */
function markedSuites() {
  const found = [];
  const walk = (dir) => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true })) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.e2e-spec.ts')) {
        const kind = MARKER.exec(readFileSync(join(root, path), 'utf8'))?.[1];
        if (kind) found.push({ path, kind });
      }
    }
  };
  walk('test');
  return found.sort((a, b) => a.path.localeCompare(b.path));
}

/** Jest's JSON results of several runs as one: counts added, suites listed together. */
function mergeResults(files, output) {
  const results = files
    .filter((f) => existsSync(f))
    .map((f) => JSON.parse(readFileSync(f, 'utf8')));
  for (const f of files) rmSync(f, { force: true });
  // A run that wrote nothing crashed: no file, and the caller counts the run as failed.
  if (results.length < files.length) return;
  const merged = { ...results[0], testResults: results.flatMap((r) => r.testResults) };
  for (const key of Object.keys(merged).filter((k) => k.startsWith('num'))) {
    merged[key] = results.reduce((n, r) => n + r[key], 0);
  }
  merged.success = results.every((r) => r.success);
  writeFileSync(output, JSON.stringify(merged));
}
