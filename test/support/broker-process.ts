import { existsSync, mkdtempSync } from 'node:fs';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { type ExitInfo, ManagedProcess, minimalEnv } from './managed-process';
import { freePort } from './ports';
import { repoRoot } from './repo-root';
import { waitFor } from './wait';

/** Options for {@link spawnBroker}. */
export interface SpawnBrokerOptions {
  /**
   * Environment of the broker, on top of `PATH` and `HOME` only (none with `command`): nothing
   * else of the test runner's environment (REDIS_URL, AWS_*) is inherited. An `undefined` value
   * leaves the variable unset. `PORT` defaults to a free port; a given one is passed on verbatim.
   */
  env: Record<string, string | undefined>;
  /**
   * Label for error messages and logs.
   * @default 'broker'
   */
  name?: string;
  /**
   * Script Node runs, absolute or relative to the repository root. Tests of the helpers pass a
   * stand-in server here, the bench the build it compares (`BENCH_BROKER_MAIN`).
   * @default 'dist/main.js' (run `npm run build` first)
   */
  script?: string;
  /** Arguments after the script. */
  args?: readonly string[];
  /** Node's own flags, before the script (the image's `CMD` gives some: `imageRuntime()`). */
  nodeArgs?: readonly string[];
  /**
   * A process other than `node <script>` (then `script` and `args` are not used): a built
   * image's `CMD`, from its folder, as its user.
   */
  command?: BrokerCommand;
  /** Also an admin listener (`ADMIN_PORT`) on a free port, at {@link BrokerProcess.adminUrl}. */
  admin?: boolean;
  /**
   * Write the output to a file of the broker's own (removed once it has exited) rather than to
   * pipes this process reads: a benchmark's load generator then spends no CPU on the audit
   * lines of the broker it loads. {@link BrokerProcess.logs} reads the file's end.
   * @default false
   */
  outputToFile?: boolean;
}

/**
 * A broker started as any command ({@link SpawnBrokerOptions.command}). Its environment is
 * `env` alone: not even the runner's `PATH` or `HOME`, which `env` gives.
 */
export interface BrokerCommand {
  /** The command and its arguments, found on `env.PATH` when not a path. */
  argv: readonly string[];
  /** Its working directory. */
  cwd: string;
  /** User and group it runs as (the runner must be root to change them). */
  uid?: number;
  gid?: number;
}

/** A broker (or stand-in) running as a child process. */
export interface BrokerProcess {
  readonly name: string;
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
  /** The port from `env.PORT` or a free one (NaN if `env.PORT` was not a number). */
  readonly port: number;
  /**
   * `http://127.0.0.1:<admin port>` when started with `admin`: where readiness answers its full
   * report. `undefined` otherwise.
   */
  readonly adminUrl: string | undefined;
  /** Process id, or `undefined` if it could not be started. */
  readonly pid: number | undefined;
  /** Resolves when the process has exited and its output is drained; never rejects. */
  readonly exited: Promise<ExitInfo>;
  /** Captured stdout and stderr lines, oldest first. */
  logs(): string[];
  isRunning(): boolean;
  /**
   * Polls `GET /health/ready` until it answers 200. Rejects at once, quoting the captured logs,
   * if the process exits first, and at the deadline otherwise.
   * @param timeoutMs @default 15_000
   */
  waitReady(timeoutMs?: number): Promise<void>;
  /**
   * Sends `signal` and resolves once the process has exited. The default SIGKILL is a crash:
   * no shutdown hook runs, a held lock is not released.
   */
  kill(signal?: NodeJS.Signals): Promise<ExitInfo>;
  /**
   * Graceful stop: SIGTERM, then SIGKILL if still running after `graceMs`.
   * @param graceMs @default 5000
   */
  stop(graceMs?: number): Promise<ExitInfo>;
}

/**
 * Starts `node dist/main.js` (or `script`, or `command`) with its own port and environment,
 * capturing its output. Returns as soon as the process is spawned: call `waitReady()` before
 * using it.
 *
 * The process is registered for cleanup: a test should still stop it in `afterAll`/`afterEach`,
 * but one that fails before doing so does not leave it running after the test run.
 */
export async function spawnBroker(opts: SpawnBrokerOptions): Promise<BrokerProcess> {
  const root = repoRoot();
  const { command } = opts;
  const script = resolve(root, opts.script ?? 'dist/main.js');
  if (!command && !existsSync(script)) {
    throw new Error(
      `${script} does not exist: run \`npm run build\` before tests that start brokers`,
    );
  }
  // A given PORT is passed on verbatim, even when it is not a number: tests of the broker's
  // config validation start it with bad values on purpose (`port` is then NaN).
  const givenPort = opts.env.PORT;
  const port = givenPort !== undefined ? Number(givenPort) : await freePort();
  const env: NodeJS.ProcessEnv = command ? {} : minimalEnv();
  for (const [key, value] of Object.entries(opts.env)) {
    if (value === undefined) delete env[key];
    else env[key] = value;
  }
  env.PORT = givenPort ?? String(port);
  const adminPort = opts.admin === true ? await freePort() : undefined;
  if (adminPort !== undefined) env.ADMIN_PORT = String(adminPort);
  const name = opts.name ?? 'broker';
  const logDir =
    opts.outputToFile === true ? mkdtempSync(join(tmpdir(), 'tb-broker-log-')) : undefined;
  const proc = ManagedProcess.start({
    name,
    ...(logDir !== undefined && { dir: logDir, logFile: join(logDir, 'output.log') }),
    ...(command
      ? {
          command: command.argv[0],
          args: command.argv.slice(1),
          cwd: command.cwd,
          uid: command.uid,
          gid: command.gid,
        }
      : {
          // The very Node binary running the tests, so the broker runs on the same version.
          command: process.execPath,
          args: [...(opts.nodeArgs ?? []), script, ...(opts.args ?? [])],
          cwd: root,
        }),
    env,
  });
  const url = `http://127.0.0.1:${port}`;

  return {
    name,
    url,
    port,
    adminUrl: adminPort !== undefined ? `http://127.0.0.1:${adminPort}` : undefined,
    pid: proc.pid,
    exited: proc.exited,
    logs: () => proc.logs(),
    isRunning: () => proc.isRunning(),
    kill: (signal: NodeJS.Signals = 'SIGKILL') => proc.kill(signal),
    stop: (graceMs = 5000) => proc.stop(graceMs),
    async waitReady(timeoutMs = 15_000): Promise<void> {
      const exitedEarly = new AbortController();
      void proc.exited.then(() => exitedEarly.abort(new Error('exited')));
      try {
        await waitFor(
          async () => {
            const status = await httpStatus(`${url}/health/ready`);
            // Thrown so that a timeout message says what readiness last answered.
            if (status !== 200) throw new Error(`GET /health/ready answered ${status}`);
            return true;
          },
          {
            timeoutMs,
            intervalMs: 50,
            what: `${name} at ${url} to be ready`,
            signal: exitedEarly.signal,
          },
        );
      } catch (err) {
        const reason = exitedEarly.signal.aborted
          ? `${proc.describeExit()} before it was ready`
          : err instanceof Error
            ? err.message
            : String(err);
        throw new Error(`${reason}; its output:\n${proc.tail(60)}`, { cause: err });
      }
    },
  };
}

/**
 * Status of one GET. node:http without keep-alive (`agent: false`), so readiness polling
 * leaves no pooled socket behind to keep Jest from exiting.
 */
async function httpStatus(url: string): Promise<number> {
  return new Promise<number>((done, fail) => {
    const req = get(url, { agent: false, timeout: 1000 }, (res) => {
      res.resume();
      res.once('end', () => done(res.statusCode ?? 0));
      res.once('error', fail);
    });
    req.once('timeout', () => req.destroy(new Error(`GET ${url} timed out`)));
    req.once('error', fail);
  });
}
