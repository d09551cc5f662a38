import { ManagedProcess, minimalEnv } from './support/managed-process';
import { freePort } from './support/ports';
import { waitFor } from './support/wait';

const CLIENT = { id: 'trial-merchant', secret: 'trial-only-secret' };

/**
 * `npm run emulator` (docs/development.md's command, build included) starts the provider emulator on its
 * own, takes its options from flags and the environment, and serves the provider's token
 * endpoint; SIGTERM stops it with the counts.
 */
describe('npm run emulator', () => {
  const started: ManagedProcess[] = [];

  afterAll(async () => {
    await Promise.all(started.map((p) => p.stop(5000)));
  });

  /** `npm run emulator`, or (`built`) the script it runs, without building it again. */
  async function emulator(args: string[], env: Record<string, string> = {}, built = false) {
    const port = await freePort();
    const own = ['--port', String(port), ...args];
    const proc = ManagedProcess.start({
      name: 'emulator',
      command: built ? process.execPath : 'npm',
      args: built
        ? ['dist-dev/emulator/main.js', ...own]
        : ['run', '--silent', 'emulator', '--', ...own],
      env: { ...minimalEnv(), ...env },
      cwd: `${__dirname}/..`,
    });
    started.push(proc);
    const line = await waitFor(
      () =>
        proc
          .logs()
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>)
          .find((l) => l.msg === 'provider emulator listening'),
      { timeoutMs: 150_000, intervalMs: 200, what: 'the emulator to listen' },
    );
    return { proc, port, line };
  }

  const stoppedLine = (proc: ManagedProcess) =>
    proc
      .logs()
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => l.msg === 'provider emulator stopped');

  const tokenRequest = (port: number, id = CLIENT.id, secret = CLIENT.secret) =>
    fetch(`http://127.0.0.1:${port}/api/auth/v1/oauth/token?grant_type=client_credentials`, {
      method: 'POST',
      headers: { authorization: `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}` },
    });

  it('starts from the command, says where it listens, and serves a token request', async () => {
    const { proc, port, line } = await emulator(['--client', `${CLIENT.id}:${CLIENT.secret}`], {
      EMULATOR_TOKEN_LIFETIME_SECONDS: '60',
    });
    expect(line).toMatchObject({
      url: `http://127.0.0.1:${port}`,
      tokenUrl: `http://127.0.0.1:${port}/api/auth/v1/oauth/token`,
      clients: [CLIENT.id],
    });
    expect(JSON.stringify(line)).not.toContain(CLIENT.secret);

    const res = await tokenRequest(port);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { access_token: string; expires_in: number };
    expect(body.access_token.length).toBeGreaterThan(10);
    expect(body.expires_in).toBe(60);
    expect((await tokenRequest(port, CLIENT.id, 'wrong')).status).toBe(401);

    // npm passes SIGTERM on to the emulator and ends by the signal itself; the emulator's own
    // clean exit is checked below, where it runs without npm.
    await proc.stop(5000);
    expect(stoppedLine(proc)).toMatchObject({
      tokenRequests: 2,
      tokensIssued: 1,
      rejectedTokenAuth: 1,
    });
  }, 180_000);

  it('applies a failure knob from the command line (the script the command runs)', async () => {
    const { proc, port } = await emulator(
      ['--client', `${CLIENT.id}:${CLIENT.secret}`, '--token-failure', 'status:503:7'],
      {},
      true,
    );
    const res = await tokenRequest(port);
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('7');
    const exit = await proc.stop(5000);
    expect(exit.code).toBe(0);
    expect(stoppedLine(proc)).toMatchObject({ tokenRequests: 1, tokensIssued: 0 });
  }, 180_000);
});
