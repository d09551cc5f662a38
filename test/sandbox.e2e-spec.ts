import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ManagedProcess, minimalEnv } from './support/managed-process';
import { freePort } from './support/ports';
import { repoRoot } from './support/repo-root';
import { waitFor } from './support/wait';

const ROOT = repoRoot();

/**
 * `npm run sandbox` (its build, `dist-dev/sandbox/sandbox.js`) as a newcomer meets it: the key
 * block is not buried under the broker's log lines, a taken port says what to do, and no exit
 * leaves the credentials files it writes behind. Its printed commands: readme-commands.e2e-spec.
 */
describe('npm run sandbox', () => {
  let tmp: string;

  beforeEach(() => {
    tmp = mkdtempSync(join(tmpdir(), 'sandbox-test-'));
  });

  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  /** The sandbox's own temporary folders (credentials and key hashes) left in `tmp`. */
  const leftBehind = () => readdirSync(tmp).filter((f) => f.startsWith('token-broker-sandbox-'));

  function start(port: number): ManagedProcess {
    return ManagedProcess.start({
      name: 'sandbox',
      command: process.execPath,
      args: [join(ROOT, 'dist-dev/sandbox/sandbox.js')],
      cwd: ROOT,
      // No LOG_LEVEL: the sandbox's default is what a newcomer gets.
      env: { ...minimalEnv(), PORT: String(port), TMPDIR: tmp },
    });
  }

  it('prints its key block without the broker info log lines, and cleans up on Ctrl-C', async () => {
    const sandbox = start(await freePort());
    try {
      await waitFor(() => /export CALLER_KEY=[0-9a-f]{64}/.test(sandbox.logs().join('\n')), {
        timeoutMs: 20_000,
        what: `the sandbox's key line (${sandbox.tail()})`,
      });
      expect(leftBehind()).toHaveLength(1);
      const exit = await sandbox.stop();
      expect(exit.code).toBe(0);
      // Warnings stay (no Redis: single replica only); the start-up chatter does not.
      expect(sandbox.logs().filter((l) => l.startsWith('{"level":"info"'))).toEqual([]);
      expect(leftBehind()).toEqual([]);
    } finally {
      await sandbox.stop();
    }
  });

  describe('on a taken port', () => {
    let taken: Server;
    let port: number;

    beforeAll(async () => {
      taken = createServer();
      await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
      port = (taken.address() as { port: number }).port;
    });

    afterAll(() => new Promise<void>((resolve) => taken.close(() => resolve())));

    it('says PORT= picks another and leaves no credentials behind', async () => {
      const sandbox = start(port);
      const exit = await waitFor(() => sandbox.exitStatus, {
        timeoutMs: 20_000,
        what: `the sandbox to give up (${sandbox.tail()})`,
      });
      expect(exit.code).toBe(1);
      expect(sandbox.logs().join('\n')).toContain(
        `sandbox failed to start: port ${port} on 127.0.0.1 is taken; pick a free one: PORT=`,
      );
      expect(leftBehind()).toEqual([]);
    });
  });
});
