import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ManagedProcess, minimalEnv } from './support/managed-process';
import { freePort } from './support/ports';
import { repoRoot } from './support/repo-root';
import { waitFor } from './support/wait';

const run = promisify(execFile);
const ROOT = repoRoot();
const SANDBOX_URL = 'http://127.0.0.1:8080';

/** Each `curl` or `node` command of the README's `sh` blocks that calls the sandbox, continuation lines joined. */
function sandboxCommands(markdown: string): string[] {
  const commands: string[] = [];
  for (const [, block] of markdown.matchAll(/```sh\n([\s\S]*?)```/g)) {
    for (const command of block.replace(/\\\n\s*/g, '').split('\n')) {
      // Only the calls: the set-up line (`npm ci && npm run sandbox`) names the URL in a comment.
      if (/^(curl|node) /.test(command) && command.includes(SANDBOX_URL)) commands.push(command);
    }
  }
  return commands;
}

/** What a command's output must show, by what it calls. */
function expectAnswered(command: string, stdout: string): void {
  if (command.includes('/orders')) expect(JSON.parse(stdout)).toHaveProperty('orderId');
  else if (command.includes('/provider/')) expect(JSON.parse(stdout)).toHaveProperty('path');
  else if (command.includes('/metrics')) expect(stdout).toMatch(/^token_broker_/m);
  else if (command.startsWith('node ')) expect(stdout).toMatch(/^Bearer \d{4}-/);
  else expect(JSON.parse(stdout)).toMatchObject({ token_type: 'Bearer' });
}

/**
 * The commands a newcomer pastes: the README's sandbox examples and the lines the sandbox prints,
 * run as written (only the port differs) against `npm run sandbox`'s build, with the key it
 * printed. A command that stops working, or a sandbox that stops printing a working line for a
 * way to get a token, fails here.
 */
describe('README and sandbox commands', () => {
  let sandbox: ManagedProcess;
  let url: string;
  let callerKey: string;

  beforeAll(async () => {
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    sandbox = ManagedProcess.start({
      name: 'sandbox',
      command: process.execPath,
      args: [join(ROOT, 'dist-dev/sandbox/sandbox.js')],
      cwd: ROOT,
      env: { ...minimalEnv(), PORT: String(port), LOG_LEVEL: 'warn' },
    });
    callerKey = await waitFor(
      () => /export CALLER_KEY=([0-9a-f]{64})/.exec(sandbox.logs().join('\n'))?.[1],
      { timeoutMs: 20_000, what: `the sandbox's key line (${sandbox.tail()})` },
    );
  });

  afterAll(async () => {
    await sandbox?.stop();
  });

  const shell = (command: string) =>
    run('sh', ['-c', command.replaceAll(SANDBOX_URL, url)], {
      cwd: ROOT,
      env: { PATH: process.env.PATH, CALLER_KEY: callerKey },
    });

  it('runs every sandbox command the README shows', async () => {
    const commands = sandboxCommands(readFileSync(join(ROOT, 'README.md'), 'utf8'));
    // GET /token, /oauth2/token, the Node client, an order, a provider call.
    expect(commands.length).toBeGreaterThanOrEqual(5);
    for (const command of commands) {
      const { stdout } = await shell(command);
      expectAnswered(command, stdout);
    }
  });

  it('prints a working line for each way to get a token and for an order', async () => {
    const printed = sandbox
      .logs()
      .join('\n')
      .replace(/\\\n\s*/g, '')
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => /^(curl|node) /.test(line));
    const needed = ['/token?', '/oauth2/token', 'createBrokerClient', '/orders', '/metrics'];
    for (const part of needed) expect(printed.some((line) => line.includes(part))).toBe(true);
    // The sandbox runs as development, where /metrics needs no caller key: none is shown.
    expect(printed.find((line) => line.includes('/metrics'))).not.toContain('CALLER_KEY');
    for (const command of printed.filter((line) => needed.some((part) => line.includes(part)))) {
      const { stdout } = await shell(command.replaceAll(url, SANDBOX_URL));
      expectAnswered(command, stdout);
    }
  });

  it('refuses the same call without the key: the sandbox authenticates callers', async () => {
    const { stdout } = await shell(`curl -s -o /dev/null -w '%{http_code}' '${SANDBOX_URL}/token'`);
    expect(stdout).toBe('401');
  });

  it('hashes an API key with the README recipe, and prints nothing when $key is unset', async () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    const section = readme.slice(readme.indexOf('### Give a service an API key'));
    const [, block] = /```sh\n([\s\S]*?)```/.exec(section) ?? [];
    const hashLine = block.split('\n').find((line) => line.includes('sha256sum'))!;
    const hash = (key?: string) =>
      run('sh', ['-c', hashLine], { env: { PATH: process.env.PATH, ...(key && { key }) } }).then(
        (r) => ({ code: 0, stdout: r.stdout }),
        (err: { code: number; stdout: string }) => ({ code: err.code, stdout: err.stdout }),
      );
    // Unset, the hash of the empty string (which the broker refuses) is never printed.
    const unset = await hash();
    expect(unset.stdout).toBe('');
    expect(unset.code).not.toBe(0);
    const key = 'a3f9'.repeat(16);
    expect(await hash(key)).toEqual({
      code: 0,
      stdout: `${createHash('sha256').update(key).digest('hex')}\n`,
    });
  });
});
