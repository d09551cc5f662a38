// Runs Jest (arguments passed on) on a Node that can load the app inside the Jest process, and
// ends with one line counting every test of the run, `N passed, N failed`, whatever the phases.
// Given test paths (or --selectProjects), one Jest run of those; given none, the whole suite
// (see runInPhases).
//
// NestJS 12 ships ES modules only. Jest's CommonJS runtime require()s them natively from Node
// 24.9 on, with `--experimental-vm-modules`: the Nodes package.json `engines` admits. On an older
// Node this script says so and re-runs itself on the Docker image's Node major (the
// `ARG NODE_IMAGE=node:<major>` of the Dockerfile), installed under .tmp/node-<major> as `.ci/run` does.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
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
  process.exit(
    runCounted(
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
console.error(
  `Node ${process.versions.node} is not one the project supports (package.json engines: 24.9 ` +
    `or later); the tests run on node@${imageMajor}, the Docker image's, from .tmp/node-${imageMajor}`,
);
if (!existsSync(join(bin, 'node'))) {
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
 * One Jest run of the given paths, or the whole suite in phases (runInPhases), each phase
 * writing its JSON results; then one closing line counting every phase's tests, so the verdict
 * is the last line on screen, not a summary scrolled away above the next phase's. A phase that
 * failed with no failed test counted (it crashed, or Jest failed after the tests) counts as one
 * failure. `--json --outputFile=<f>` also gets the runs' JSON results as one. Returns the exit
 * status.
 */
function runCounted(jest) {
  const output = optionValue('--outputFile');
  const rest = withoutOptions(['--outputFile', '--json']);
  const single = rest.some((a) => !a.startsWith('-') || a.startsWith('--selectProjects'));
  const phases = single ? [['run', []]] : suitePhases();
  const dir = mkdtempSync(join(tmpdir(), 'tb-jest-results-'));
  try {
    const runs = phases.map(([name, argv]) => {
      const file = join(dir, `${name}.json`);
      const status = jest([...argv, ...rest, '--json', `--outputFile=${file}`]);
      return { name, status, results: existsSync(file) ? readJson(file) : undefined };
    });
    let failed = 0;
    for (const run of runs) {
      const counted = run.results
        ? run.results.numFailedTests + run.results.numRuntimeErrorTestSuites
        : 0;
      failed += counted;
      if (run.status !== 0 && counted === 0) {
        console.error(
          `${phaseName(run, runs)}: Jest exited ${run.status} with no failed test counted`,
        );
        failed += 1;
      }
    }
    const passed = runs.reduce((n, r) => n + (r.results?.numPassedTests ?? 0), 0);
    const skipped = runs.reduce(
      (n, r) => n + (r.results ? r.results.numPendingTests + r.results.numTodoTests : 0),
      0,
    );
    if (output) writeFileSync(output, JSON.stringify(mergeResults(runs)));
    console.log(`\n${passed} passed, ${failed} failed${skipped > 0 ? `, ${skipped} skipped` : ''}`);
    return failed === 0 ? 0 : 1;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function phaseName(run, runs) {
  return runs.length === 1 ? 'jest' : `phase ${run.name}`;
}

function readJson(file) {
  return JSON.parse(readFileSync(file, 'utf8'));
}

/** The value of `--name=v` or `--name v` among the arguments. */
function optionValue(name) {
  const i = args.findIndex((a) => a === name || a.startsWith(`${name}=`));
  if (i < 0) return undefined;
  return args[i] === name ? args[i + 1] : args[i].slice(name.length + 1);
}

/** The arguments without the named options (and a separate value of a valued one). */
function withoutOptions(names) {
  const out = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (names.some((n) => a.startsWith(`${n}=`))) continue;
    if (names.includes(a)) {
      if (a === '--outputFile') i++;
      continue;
    }
    out.push(a);
  }
  return out;
}

/**
 * The whole suite (no test path given), in three phases: the suites that do not time anything
 * on two workers; then those marked `@timed` on two workers, beside no other kind of suite
 * (they time brokers under a load that leaves room for one more such suite); then those marked
 * `@alone` one after another (their load takes both cores, so a second suite beside them would
 * be part of what they measure). Jest replaces a worker that holds more than
 * WORKER_MEMORY_LIMIT after a suite: in one long-lived heap the collector's pauses grew to
 * seconds, and the emulator and the load generators run in that process.
 */
function suitePhases() {
  const marked = markedSuites();
  const timed = marked.filter((m) => m.kind === 'timed').map((m) => m.path);
  const alone = marked.filter((m) => m.kind === 'alone').map((m) => m.path);
  const memory = `--workerIdleMemoryLimit=${WORKER_MEMORY_LIMIT}`;
  return [
    [
      'shared',
      [
        '--maxWorkers=2',
        '--testPathIgnorePatterns',
        '/node_modules/',
        ...marked.map((m) => escape(m.path)),
        memory,
      ],
    ],
    ['timed', ['--maxWorkers=2', memory, '--runTestsByPath', ...timed]],
    ['alone', ['--maxWorkers=1', memory, '--runTestsByPath', ...alone]],
  ].filter(([name, argv]) => name === 'shared' || argv.length > 3);
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
function mergeResults(runs) {
  const results = runs.map((r) => r.results).filter((r) => r !== undefined);
  if (results.length === 0) return { success: false, numFailedTests: 0, testResults: [] };
  const merged = { ...results[0], testResults: results.flatMap((r) => r.testResults) };
  for (const key of Object.keys(merged).filter((k) => k.startsWith('num'))) {
    merged[key] = results.reduce((n, r) => n + r[key], 0);
  }
  // A run that wrote nothing crashed: the whole run failed.
  merged.success = results.length === runs.length && runs.every((r) => r.status === 0);
  return merged;
}
