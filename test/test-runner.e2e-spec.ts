import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './support/repo-root';

const ROOT = repoRoot();

/**
 * `scripts/test.mjs`, the runner behind `npm test`, run on a throwaway Jest project of plain
 * JavaScript tests: whatever Jest printed before, its last line is the run's verdict, and its
 * exit status agrees with it.
 */
describe('scripts/test.mjs', () => {
  let dir: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'test-runner-'));
    writeFileSync(
      join(dir, 'jest.config.js'),
      `module.exports = { rootDir: ${JSON.stringify(dir)}, testMatch: ['**/*.check.js'] };\n`,
    );
    writeFileSync(
      join(dir, 'mixed.check.js'),
      "test('passes', () => expect(1).toBe(1));\ntest('fails', () => expect(1).toBe(2));\n",
    );
    writeFileSync(join(dir, 'green.check.js'), "test('passes too', () => expect(2).toBe(2));\n");
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  function run(...paths: string[]) {
    const output = join(dir, 'results.json');
    const r = spawnSync(
      process.execPath,
      [
        join(ROOT, 'scripts', 'test.mjs'),
        '--config',
        join(dir, 'jest.config.js'),
        '--json',
        `--outputFile=${output}`,
        ...paths,
      ],
      { cwd: ROOT, encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } },
    );
    const lines = r.stdout.trimEnd().split('\n');
    return { status: r.status, last: lines[lines.length - 1], output, stderr: r.stderr };
  }

  it('ends with one line counting every test, and exits 1 when one failed', () => {
    const r = run(join(dir, 'mixed.check.js'), join(dir, 'green.check.js'));
    expect(r.last).toBe('2 passed, 1 failed');
    expect(r.status).toBe(1);
    const merged = JSON.parse(readFileSync(r.output, 'utf8')) as Record<string, unknown>;
    expect(merged).toMatchObject({ numPassedTests: 2, numFailedTests: 1, success: false });
  });

  it('exits 0 with a green count when every test passed', () => {
    const r = run(join(dir, 'green.check.js'));
    expect(r.last).toBe('1 passed, 0 failed');
    expect(r.status).toBe(0);
  });
});
