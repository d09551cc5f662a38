import { type ChildProcess, execFileSync, spawn, type SpawnOptions } from 'node:child_process';
import { closeSync, fstatSync, openSync, readSync, rmSync } from 'node:fs';
import { setPriority } from 'node:os';
import { runInThisContext } from 'node:vm';

/** How a child process ended. */
export interface ExitInfo {
  /** Exit code, or `null` when a signal ended it (or it never started). */
  code: number | null;
  /** The signal that ended it, if any. */
  signal: NodeJS.Signals | null;
  /** Set when the process could not be started at all (e.g. `ENOENT`). */
  error?: Error;
}

/** The nice value of the Redis servers and sentinels the tests start (see `priority`). */
export const REDIS_PRIORITY = -5;

/** Options for {@link ManagedProcess.start}. */
export interface ManagedProcessOptions {
  /** Label used in error messages ("redis-server:6399", "broker-0"). */
  name: string;
  command: string;
  args: readonly string[];
  /** Complete environment of the child: nothing is inherited implicitly. */
  env: NodeJS.ProcessEnv;
  cwd?: string;
  /** User and group to run as (changing them needs root): a built image's `USER`. */
  uid?: number;
  gid?: number;
  /**
   * A folder of the process's own (its data, its configuration), removed once it has exited:
   * also when the exit hook kills it because the runner exits first.
   */
  dir?: string;
  /**
   * Keep at most this many captured lines (the oldest are dropped), so a chatty process under
   * load cannot exhaust the test's memory.
   * @default 50_000
   */
  maxLogLines?: number;
  /**
   * Write stdout and stderr to this file (created, or emptied) rather than to pipes read here,
   * as a container runtime's log driver takes a process's output: a chatty process under load
   * then costs this one no CPU (a benchmark's load generator). {@link ManagedProcess.logs} reads
   * the file's end; once the process has exited, its last lines are kept in memory, so the file
   * may be in `dir`.
   */
  logFile?: string;
  /**
   * Scheduling priority (nice value) to give the process, when this user may (root may raise
   * it): Redis and its sentinels run on machines of their own in production, here they share
   * two cores with the brokers and the load generator. A sentinel starved of its timer for 2 s
   * enters TILT mode and stops failing over for 30 s.
   */
  priority?: number;
  /**
   * Run under the real-time FIFO scheduler (`chrt -f 1`), when this user may: for sentinels,
   * which use little CPU but must not miss their timer (see `priority`) on a loaded machine.
   */
  realtime?: boolean;
}

/**
 * A child process that is registered for cleanup and whose output is kept in memory.
 *
 * Children are `unref`'d: a test that forgets to stop one must not keep Jest from exiting,
 * and once Jest exits, the exit hook below kills the child. Waiting for an exit re-`ref`s it so
 * a plain Node script (the benchmark) that awaits `kill()` is not cut short.
 */
export class ManagedProcess {
  /** Resolves once the process has exited and its output is drained; never rejects. */
  readonly exited: Promise<ExitInfo>;
  private readonly lines: string[] = [];
  private droppedLines = 0;
  private exitInfo: ExitInfo | undefined;
  /** With `logFile`: its last lines, read once the process has exited. */
  private fileTail: string[] | undefined;

  private constructor(
    readonly name: string,
    private readonly child: ChildProcess,
    private readonly maxLogLines: number,
    dir: string | undefined,
    private readonly logFile: string | undefined,
  ) {
    const registry = childRegistry();
    registry.set(child, dir);
    this.exited = new Promise<ExitInfo>((resolve) => {
      let streamsOpen = 0;
      let exit: ExitInfo | undefined;
      let drainTimer: NodeJS.Timeout | undefined;
      const finish = () => {
        if (!exit || this.exitInfo) return;
        clearTimeout(drainTimer);
        registry.delete(child);
        if (logFile !== undefined) this.fileTail = readTail(logFile, maxLogLines);
        removeDir(dir);
        this.exitInfo = exit;
        resolve(exit);
      };
      for (const stream of [child.stdout, child.stderr]) {
        if (!stream) continue;
        streamsOpen++;
        let pending = '';
        stream.setEncoding('utf8');
        stream.on('data', (chunk: string) => {
          pending += chunk;
          const parts = pending.split('\n');
          pending = parts.pop() ?? '';
          for (const line of parts) this.push(line);
        });
        stream.once('close', () => {
          if (pending) this.push(pending);
          pending = '';
          streamsOpen--;
          if (streamsOpen === 0) finish();
        });
        (stream as { unref?: () => void }).unref?.();
      }
      child.once('exit', (code, signal) => {
        exit = { code, signal };
        // Output normally drains within milliseconds of the exit; a grandchild that inherited
        // the pipes could hold them open forever, so do not wait on them indefinitely. (Not
        // unref'd: someone awaiting `exited` needs the event loop kept alive until then.)
        drainTimer = setTimeout(finish, 500);
        if (streamsOpen === 0) finish();
      });
      child.once('error', (error) => {
        // 'error' without 'exit' means the process never ran (bad command, EACCES).
        if (child.pid === undefined) {
          exit = { code: null, signal: null, error };
          this.push(`[spawn error] ${error.message}`);
          finish();
        }
      });
    });
    child.unref();
  }

  /**
   * Spawns `command` with piped stdout/stderr captured line by line (or written to `logFile`).
   * Returns at once: use {@link ManagedProcess.exited} or a readiness probe to learn whether it
   * really started.
   */
  static start(opts: ManagedProcessOptions): ManagedProcess {
    const output = opts.logFile === undefined ? 'pipe' : openSync(opts.logFile, 'w', 0o600);
    const spawnOptions: SpawnOptions = {
      cwd: opts.cwd,
      env: opts.env,
      uid: opts.uid,
      gid: opts.gid,
      stdio: ['ignore', output, output],
      // Same process group as the test runner: a Ctrl-C in the terminal reaches the children too.
      detached: false,
    };
    let child: ChildProcess;
    try {
      child = spawn(opts.command, [...opts.args], spawnOptions);
    } finally {
      // The child holds its own copy of the descriptor.
      if (typeof output === 'number') closeSync(output);
    }
    if (opts.priority !== undefined && child.pid !== undefined) {
      try {
        setPriority(child.pid, opts.priority);
      } catch {
        // Not allowed (not root): it runs at the default priority.
      }
    }
    if (opts.realtime === true && child.pid !== undefined) {
      try {
        execFileSync('chrt', ['-f', '-p', '1', String(child.pid)], { stdio: 'ignore' });
      } catch {
        // No chrt, or not allowed: the nice value above is all it gets.
      }
    }
    return new ManagedProcess(opts.name, child, opts.maxLogLines ?? 50_000, opts.dir, opts.logFile);
  }

  /** Process id, or `undefined` if it could not be started. */
  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Whether the process is still running (has not been seen to exit). */
  isRunning(): boolean {
    return (
      this.child.pid !== undefined && this.child.exitCode === null && this.child.signalCode === null
    );
  }

  /** How it ended, once it has. */
  get exitStatus(): ExitInfo | undefined {
    return this.exitInfo;
  }

  /** Captured stdout and stderr lines, oldest first (with `logFile`, its last lines). */
  logs(): string[] {
    const captured =
      this.droppedLines > 0
        ? [`[${this.droppedLines} earlier lines dropped]`, ...this.lines]
        : [...this.lines];
    if (this.logFile === undefined) return captured;
    // `captured` then holds only what this module itself notes (a spawn error).
    return [...(this.fileTail ?? readTail(this.logFile, this.maxLogLines)), ...captured];
  }

  /** The last `n` lines, joined for an error message. */
  tail(n = 40): string {
    const logs = this.logs();
    return logs.slice(-n).join('\n');
  }

  /** Sends `signal` (if still running) and resolves when the process has exited. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<ExitInfo> {
    if (this.isRunning()) {
      this.child.ref();
      this.child.kill(signal);
    }
    return this.exited;
  }

  /**
   * Sends SIGTERM and, if the process has not exited after `graceMs`, SIGKILL. Resolves with
   * how it ended.
   */
  async stop(graceMs = 5000): Promise<ExitInfo> {
    if (!this.isRunning()) return this.exited;
    this.child.ref();
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => {
      if (this.isRunning()) this.child.kill('SIGKILL');
    }, graceMs);
    try {
      return await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Describes how the process ended, for error messages. */
  describeExit(): string {
    const e = this.exitInfo;
    if (!e) return `${this.name} is still running`;
    if (e.error) return `${this.name} could not be started: ${e.error.message}`;
    return e.signal
      ? `${this.name} was killed by ${e.signal}`
      : `${this.name} exited with code ${String(e.code)}`;
  }

  private push(line: string): void {
    this.lines.push(line);
    if (this.lines.length > this.maxLogLines) {
      this.lines.shift();
      this.droppedLines++;
    }
  }
}

/** How much of a `logFile`'s end {@link readTail} reads at most. */
const TAIL_BYTES = 1024 * 1024;

/**
 * The last `maxLines` lines of a log file, from at most its last {@link TAIL_BYTES}; none if it
 * cannot be read (gone already). Never throws: it also runs when the process exits.
 */
function readTail(file: string, maxLines: number): string[] {
  let fd: number | undefined;
  try {
    fd = openSync(file, 'r');
    const size = fstatSync(fd).size;
    const start = Math.max(0, size - TAIL_BYTES);
    const buffer = Buffer.alloc(size - start);
    const read = readSync(fd, buffer, 0, buffer.length, start);
    const lines = buffer.toString('utf8', 0, read).split('\n');
    if (lines.at(-1) === '') lines.pop();
    // Cut in the middle of a line: that line is not whole.
    if (start > 0) lines.shift();
    const dropped = start > 0 || lines.length > maxLines;
    const kept = lines.slice(-maxLines);
    return dropped ? ['[earlier lines dropped]', ...kept] : kept;
  } catch {
    return [];
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/**
 * Registers a child started elsewhere (a benchmark's forked helper, which talks over IPC) for
 * the same cleanup as {@link ManagedProcess}: killed, and `dir` removed, if the runner exits
 * first.
 */
export function adoptChild(child: ChildProcess, dir?: string): void {
  const registry = childRegistry();
  registry.set(child, dir);
  child.once('exit', () => {
    registry.delete(child);
    removeDir(dir);
  });
}

/**
 * Kills every child process started through this module that is still alive, and removes the
 * folders they own. Synchronous, so it can run from a process 'exit' hook.
 */
export function killAllManagedProcesses(): void {
  killAll(childRegistry());
}

function killAll(children: Map<ChildProcess, string | undefined>): void {
  for (const [child, dir] of children) {
    try {
      child.kill('SIGKILL');
    } catch {
      // Already gone: nothing to clean up.
    }
    // Without waiting for the exit, which an 'exit' hook cannot: once the folder is unlinked,
    // the process (if it has not died yet) can create nothing in it.
    removeDir(dir);
  }
  children.clear();
}

/** Removes a process's folder, never throwing: it also runs from the 'exit' hook. */
function removeDir(dir: string | undefined): void {
  if (dir === undefined) return;
  try {
    rmSync(dir, { recursive: true, force: true, maxRetries: 2 });
  } catch {
    // A file appeared meanwhile (ENOTEMPTY), or it is not ours to remove: leave it.
  }
}

const REGISTRY_KEY = Symbol.for('token-broker.test.children');

type HostProcess = NodeJS.Process & { [REGISTRY_KEY]?: Map<ChildProcess, string | undefined> };

/**
 * The registry lives on the *real* process object, with a single 'exit' hook.
 *
 * Why not `process.on('exit')`: inside Jest, `process` is a per-test-file copy whose event
 * emitter is never told that the worker exits, so such hooks silently never run. The real
 * process is reachable through `vm.runInThisContext`, which evaluates in Node's main context
 * rather than Jest's sandbox (outside Jest it is simply `process`). Keeping one registry there
 * also avoids stacking one hook per test file (and the MaxListeners warning that brings).
 */
function childRegistry(): Map<ChildProcess, string | undefined> {
  const host = hostProcess() as HostProcess;
  let registry = host[REGISTRY_KEY];
  if (!registry) {
    const created = new Map<ChildProcess, string | undefined>();
    registry = created;
    host[REGISTRY_KEY] = created;
    host.on('exit', () => killAll(created));
  }
  return registry;
}

/**
 * The environment a child starts from: only what is needed to find executables and a home
 * directory, so settings of the developer's shell (REDIS_URL, AWS_*, NODE_OPTIONS) cannot leak
 * into a test's process and make it pass or fail for reasons the test does not show.
 */
export function minimalEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const name of ['PATH', 'HOME'] as const) {
    const value = process.env[name];
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/**
 * The Node process object of the host, also from inside a Jest sandbox (see
 * {@link childRegistry} for why that differs from `process`). For per-process caches and
 * hooks that must outlive one test file.
 */
export function hostProcess(): NodeJS.Process {
  return runInThisContext('process') as NodeJS.Process;
}
