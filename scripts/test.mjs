// Runs Jest (arguments passed on) on a Node that can load the app inside the Jest process.
//
// NestJS 12 ships ES modules only. Jest's CommonJS runtime require()s them natively from Node
// 24.9 on, with `--experimental-vm-modules`; before that nothing can run the app in-process.
// On an older Node this script re-runs itself on the Docker image's Node major (the first
// `FROM node:<major>` of the Dockerfile), installed under .tmp/node-<major> as `.ci/run` does.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);

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
  runAndExit(process.execPath, [jest, ...args], { ...process.env, NODE_OPTIONS: nodeOptions });
}

const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8');
const imageMajor = /^FROM node:(\d+)/m.exec(dockerfile)?.[1];
if (imageMajor === undefined) {
  throw new Error(
    `Node ${process.versions.node} cannot run the app inside Jest (needs >= 24.9), and the ` +
      'Dockerfile names no `FROM node:<major>` to use instead',
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
