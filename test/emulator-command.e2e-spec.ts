import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GetSecretValueCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
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

/**
 * `npm run emulator -- secrets --secret <id>=<file>` (its script, built): the Secrets Manager
 * emulator for trying a broker's secret ids locally, asked by the real AWS SDK with the
 * variables its listening line gives.
 */
describe('npm run emulator -- secrets', () => {
  let dir: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'emulator-secrets-'));
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  function secrets(args: string[]): ManagedProcess {
    return ManagedProcess.start({
      name: 'secrets-emulator',
      command: process.execPath,
      args: ['dist-dev/emulator/main.js', 'secrets', ...args],
      env: minimalEnv(),
      cwd: `${__dirname}/..`,
    });
  }

  const jsonLines = (proc: ManagedProcess) =>
    proc
      .logs()
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);

  it('serves a file as a secret id to the AWS SDK, printing the variables to reach it', async () => {
    const value = JSON.stringify({ client_id: 'trial-merchant', client_secret: 'trial-secret' });
    const file = join(dir, 'acme.json');
    writeFileSync(file, value, { mode: 0o600 });
    const port = await freePort();
    const proc = secrets(['--port', String(port), '--secret', `token-broker/acme=${file}`]);
    try {
      const line = await waitFor(
        () => jsonLines(proc).find((l) => l.msg === 'secrets manager emulator listening'),
        { timeoutMs: 20_000, what: `the emulator to listen (${proc.tail()})` },
      );
      expect(line).toMatchObject({
        url: `http://127.0.0.1:${port}`,
        secretIds: ['token-broker/acme'],
        env: { AWS_ENDPOINT_URL_SECRETS_MANAGER: `http://127.0.0.1:${port}` },
      });
      expect(JSON.stringify(line)).not.toContain('trial-secret');

      const env = line.env as Record<string, string>;
      const client = new SecretsManagerClient({
        endpoint: env.AWS_ENDPOINT_URL_SECRETS_MANAGER,
        region: env.AWS_REGION,
        credentials: {
          accessKeyId: env.AWS_ACCESS_KEY_ID,
          secretAccessKey: env.AWS_SECRET_ACCESS_KEY,
        },
      });
      try {
        const got = await client.send(new GetSecretValueCommand({ SecretId: 'token-broker/acme' }));
        expect(got.SecretString).toBe(value);
        await expect(
          client.send(new GetSecretValueCommand({ SecretId: 'token-broker/other' })),
        ).rejects.toMatchObject({ name: 'ResourceNotFoundException' });
      } finally {
        client.destroy();
      }
      const exit = await proc.stop(5000);
      expect(exit.code).toBe(0);
      expect(
        jsonLines(proc).find((l) => l.msg === 'secrets manager emulator stopped'),
      ).toMatchObject({ requests: 2 });
    } finally {
      await proc.stop(5000);
    }
  });

  it.each([
    [['--secret', 'no-file-named'], '--secret must be <secret id>=<file holding its value>'],
    [
      ['--secret', 'acme=/nonexistent/acme.json'],
      '--secret acme: cannot read /nonexistent/acme.json (ENOENT)',
    ],
    [[], 'secrets needs at least one --secret <secret id>=<file>'],
  ])('refuses %j with exit 64 and a message naming what is wrong', async (args, message) => {
    const proc = secrets(args);
    const exit = await waitFor(() => proc.exitStatus, { timeoutMs: 20_000, what: 'the exit' });
    expect(exit.code).toBe(64);
    expect(jsonLines(proc)).toContainEqual({ level: 'error', msg: message });
  });
});
