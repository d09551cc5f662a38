import { execFile } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  copyFileSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
} from 'node:fs';
import { randomBytes } from 'node:crypto';
import { basename, join, posix, relative, resolve } from 'node:path';
import { promisify } from 'node:util';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import type { BrokerProcess } from './support/broker-process';
import { envOf, globalArgs, parseDockerfile } from './support/dockerfile';
import { machineTmpdir } from './support/run-tmpdir';
import { type Stack, startStack } from './support/stack';

/**
 * The Docker image's runtime stage, proven without a container engine: this suite reads the
 * `Dockerfile` and `.dockerignore` and replays them in temporary directories:
 *
 * - build stage: its `COPY`s from the build context (filtered by `.dockerignore`, so a file the
 *   Dockerfile needs but the context excludes fails here as it would in `docker build`) and its
 *   `RUN`s (`npm ci`, build, prune) exactly as written;
 * - runtime stage: its `COPY --from=build`s, `ENV`, `USER` and `CMD`. Its `RUN`s only strip the
 *   base image (npm) and are not replayed; the app is started with a PATH holding `node` alone,
 *   which proves the same thing: nothing needs npm at run time.
 *
 * Then it starts the pruned app as the image's `CMD`, with the app tree made read-only, as the
 * image's numeric `USER` when the suite runs as root, with HOME and TMPDIR in a scratch
 * directory, against the provider emulator, and waits for `GET /health/ready` = 200.
 */

const ROOT = resolve(__dirname, '..');
const run = promisify(execFile);

/** `.dockerignore` semantics: a pattern matches a path or any of its parents; last match wins. */
function dockerignore(text: string): (relPath: string) => boolean {
  const patterns = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => {
      const negate = l.startsWith('!');
      const cleaned = posix.normalize((negate ? l.slice(1) : l).trim()).replace(/^\/+|\/+$/g, '');
      const source = cleaned
        .split(/(\*\*\/|\*\*|\*|\?)/)
        .map((part) => {
          if (part === '**/') return '(?:.*/)?';
          if (part === '**') return '.*';
          if (part === '*') return '[^/]*';
          if (part === '?') return '[^/]';
          return part.replace(/[.+^${}()|[\]\\]/g, '\\$&');
        })
        .join('');
      return { negate, regex: new RegExp(`^${source}$`) };
    });
  return (relPath) => {
    const parts = relPath.split('/');
    const prefixes = parts.map((_, i) => parts.slice(0, i + 1).join('/'));
    let excluded = false;
    for (const p of patterns) {
      if (prefixes.some((prefix) => p.regex.test(prefix))) excluded = !p.negate;
    }
    return excluded;
  };
}

/** Splits `COPY [--flag=value...] src... dest` (shell or JSON form). */
function copyArgs(args: string): { flags: Map<string, string>; sources: string[]; dest: string } {
  const flags = new Map<string, string>();
  let rest = args;
  for (
    let m = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest);
    m;
    m = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest)
  ) {
    flags.set(m[1], m[2] ?? '');
    rest = rest.slice(m[0].length);
  }
  const words = rest.startsWith('[') ? (JSON.parse(rest) as string[]) : rest.split(/\s+/);
  if (words.length < 2)
    throw new Error(`Dockerfile: COPY needs a source and a destination: ${args}`);
  return { flags, sources: words.slice(0, -1), dest: words[words.length - 1] };
}

/** Maps a path inside the image to the directory standing for the stage's WORKDIR. */
function hostPath(stageDir: string, workdir: string, imagePath: string): string {
  const absolute = posix.resolve(workdir, imagePath);
  const rel = posix.relative(workdir, absolute);
  if (rel.startsWith('..')) {
    throw new Error(
      `Dockerfile: ${imagePath} is outside WORKDIR ${workdir}; not reproducible here`,
    );
  }
  return join(stageDir, rel);
}

/** Files under `dir` (relative, posix separators), symlinks included but not followed. */
function walk(dir: string, base = ''): string[] {
  return readdirSync(join(dir, base), { withFileTypes: true }).flatMap((e) => {
    const rel = base === '' ? e.name : `${base}/${e.name}`;
    return e.isDirectory() ? walk(dir, rel) : [rel];
  });
}

/** `chmod -R`, leaving symlinks alone (chmod would follow them). */
function chmodTree(dir: string, change: (mode: number) => number): void {
  for (const entry of ['', ...walkAll(dir)]) {
    const path = join(dir, entry);
    const stat = lstatSync(path);
    if (!stat.isSymbolicLink()) chmodSync(path, change(stat.mode & 0o7777));
  }
}

function walkAll(dir: string, base = ''): string[] {
  return readdirSync(join(dir, base), { withFileTypes: true }).flatMap((e) => {
    const rel = base === '' ? e.name : `${base}/${e.name}`;
    return e.isDirectory() ? [rel, ...walkAll(dir, rel)] : [rel];
  });
}

/** Polls until `check` returns true, failing at the deadline or when `abort` says why. */
async function waitUntil(
  what: string,
  timeoutMs: number,
  check: () => Promise<boolean>,
  abort: () => string | undefined,
  explain?: () => string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const reason = abort();
    if (reason !== undefined) throw new Error(`${what}: ${reason}`);
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) {
      throw new Error(`${what}: not within ${timeoutMs} ms${explain ? `\n${explain()}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

const CLIENT_ID = 'runtime-stage';
const CREDENTIALS = { client_id: 'image-client', client_secret: 'image-secret-value' };
/** The image runs with NODE_ENV=production, where caller authentication cannot be off. */
const API_KEY = randomBytes(24).toString('base64url');
/** An operator's: in production without ADMIN_PORT, `/metrics` needs scope admin on every client. */
const OPS_KEY = randomBytes(24).toString('base64url');

describe('Docker runtime stage', () => {
  const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
  const stages = parseDockerfile(dockerfile);
  const buildStage = stages[0];
  const runtimeStage = stages[stages.length - 1];
  const excluded = dockerignore(readFileSync(join(ROOT, '.dockerignore'), 'utf8'));

  let scratch: string;
  let appDir: string;
  const runtimeEnv: Record<string, string> = {};
  let runtimeUser: { uid: number; gid: number } | undefined;
  let cmd: string[] = [];
  /** The provider emulator, the config and the credentials the app is started on. */
  let stack: Stack | undefined;
  let emulator: ProviderEmulator | undefined;
  let app: BrokerProcess | undefined;
  let appExit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  let baseUrl = '';

  /** Replays the build stage, then the runtime stage's copies, into `scratch`. */
  async function assemble(): Promise<void> {
    const buildDir = join(scratch, 'build');
    mkdirSync(buildDir);
    let workdir = '/';
    const runEnv = {
      ...process.env,
      CI: 'true',
      // The Dockerfile's own npm commands, but served from the local cache when it has them.
      npm_config_prefer_offline: 'true',
      npm_config_update_notifier: 'false',
    };
    for (const { op, args } of buildStage.instructions) {
      if (op === 'WORKDIR') {
        workdir = posix.resolve(workdir, args);
      } else if (op === 'COPY') {
        const { flags, sources, dest } = copyArgs(args);
        if (flags.has('from')) throw new Error('build stage: COPY --from is not reproduced');
        for (const source of sources) {
          const rel = posix.normalize(source).replace(/\/+$/, '');
          const files = existsSync(join(ROOT, rel))
            ? lstatSync(join(ROOT, rel)).isDirectory()
              ? walk(join(ROOT, rel)).map((f) => `${rel}/${f}`)
              : [rel]
            : [];
          const included = files.filter((f) => !excluded(f));
          if (included.length === 0) {
            throw new Error(`COPY ${source}: missing, or excluded by .dockerignore`);
          }
          const isDir = lstatSync(join(ROOT, rel)).isDirectory();
          const target = hostPath(buildDir, workdir, dest);
          for (const file of included) {
            const to =
              isDir || dest.endsWith('/') || sources.length > 1
                ? join(target, isDir ? relative(rel, file) : basename(file))
                : target;
            cpSync(join(ROOT, file), to, { verbatimSymlinks: true });
          }
        }
      } else if (op === 'RUN') {
        const cwd = hostPath(buildDir, workdir, '.');
        mkdirSync(cwd, { recursive: true });
        await run('sh', ['-c', args], { cwd, env: runEnv, maxBuffer: 64 * 1024 * 1024 }).catch(
          (err: { stdout?: string; stderr?: string; message: string }) => {
            throw new Error(
              `RUN ${args}\n${err.message}\n${(err.stdout ?? '').slice(-4000)}\n${(err.stderr ?? '').slice(-4000)}`,
            );
          },
        );
      }
    }
    const buildWorkdir = workdir;

    appDir = join(scratch, 'app');
    mkdirSync(appDir);
    workdir = '/';
    for (const { op, args } of runtimeStage.instructions) {
      if (op === 'WORKDIR') workdir = posix.resolve(workdir, args);
      if (op === 'ENV') Object.assign(runtimeEnv, envOf(args));
      if (op === 'USER') {
        const m = /^(\d+)(?::(\d+))?$/.exec(args);
        runtimeUser = m ? { uid: Number(m[1]), gid: Number(m[2] ?? m[1]) } : undefined;
      }
      if (op === 'CMD') cmd = JSON.parse(args) as string[];
      if (op === 'COPY') {
        const { flags, sources, dest } = copyArgs(args);
        if (flags.get('from') !== buildStage.name) {
          throw new Error(
            `runtime stage: only COPY --from=${buildStage.name} is reproduced: ${args}`,
          );
        }
        for (const source of sources) {
          const from = hostPath(buildDir, buildWorkdir, posix.resolve('/', source));
          const to = hostPath(appDir, workdir, dest);
          if (!existsSync(from))
            throw new Error(`COPY --from=build ${source}: not produced by the build`);
          cpSync(from, to, { recursive: true, verbatimSymlinks: true });
        }
      }
    }
    appDir = hostPath(appDir, workdir, '.');
  }

  beforeAll(async () => {
    scratch = mkdtempSync(join(machineTmpdir(), 'tb-runtime-stage-'));
    // Traversable by the image's user when the suite runs as root and drops to it.
    chmodSync(scratch, 0o755);
    await assemble();
  }, 600_000);

  afterAll(async () => {
    await stack?.close();
    if (scratch) {
      chmodTree(scratch, (mode) => mode | 0o200);
      rmSync(scratch, { recursive: true, force: true });
    }
  });

  it('follows STYLE.md: node base image, npm ci and prune, non-root numeric USER, NODE_ENV, CMD', () => {
    expect(buildStage.image).toMatch(/^node:\d+(?:[.-]|$)/);
    expect(runtimeStage.image).toMatch(/^node:\d+(?:[.-]|$)/);
    // Same Node major in both stages: the build compiles for the runtime it ships.
    expect(runtimeStage.image.split(/[:.-]/)[1]).toBe(buildStage.image.split(/[:.-]/)[1]);
    const runs = buildStage.instructions.filter((i) => i.op === 'RUN').map((i) => i.args);
    expect(runs.some((r) => /\bnpm ci\b/.test(r))).toBe(true);
    expect(runs.some((r) => /\bnpm prune --omit=dev\b/.test(r))).toBe(true);
    expect(runtimeUser).toBeDefined();
    expect(runtimeUser?.uid).not.toBe(0);
    expect(runtimeEnv.NODE_ENV).toBe('production');
    // The young generation and malloc's arenas bounded (docs/deploy.md, Memory); the bench
    // starts its replicas with the same flags and ENV (imageRuntime).
    expect(cmd).toEqual(['node', '--max-semi-space-size=2', 'dist/main.js']);
    expect(runtimeEnv.MALLOC_ARENA_MAX).toBe('2');
  });

  it('takes its base image from one ARG, which a release build pins by digest', () => {
    // Both stages from NODE_IMAGE, whose default is what the tests ran on (.ci/run reads it).
    expect(globalArgs(dockerfile).get('NODE_IMAGE')).toMatch(/^node:\d+-/);
    expect([buildStage.imageAsWritten, runtimeStage.imageAsWritten]).toEqual([
      '${NODE_IMAGE}',
      '${NODE_IMAGE}',
    ]);
    // The comment tells a release build how to pin it.
    expect(dockerfile).toContain('--build-arg NODE_IMAGE=node:');
  });

  it('ships only production dependencies and the compiled app', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
      devDependencies: Record<string, string>;
    };
    for (const dep of Object.keys(pkg.dependencies)) {
      expect([dep, existsSync(join(appDir, 'node_modules', dep, 'package.json'))]).toEqual([
        dep,
        true,
      ]);
    }
    for (const dep of Object.keys(pkg.devDependencies)) {
      expect([dep, existsSync(join(appDir, 'node_modules', dep))]).toEqual([dep, false]);
    }
    expect(existsSync(join(appDir, 'dist', 'main.js'))).toBe(true);
    // No source map, nor a pointer to one: it would describe the source tree to whoever reads
    // the image, and nothing there uses it.
    expect(walk(join(appDir, 'dist')).filter((f) => f.endsWith('.map'))).toEqual([]);
    expect(readFileSync(join(appDir, 'dist', 'main.js'), 'utf8')).not.toContain('sourceMappingURL');
    // No sources, tests or build configuration: only what `node dist/main.js` needs.
    expect(readdirSync(appDir).filter((f) => /^(src|test|tsconfig.*|\..*)$/.test(f))).toEqual([]);
    expect(walk(join(appDir, 'dist')).filter((f) => /\.spec\.js$|\.ts$/.test(f))).toEqual([]);
    // No dev tools: the emulators, the sandbox and the benchmarks live outside `src/` and are
    // built into `dist-dev/`; neither a file of theirs nor a reference to one is in the image.
    const distFiles = walk(join(appDir, 'dist'));
    expect(distFiles.filter((f) => /(^|[/.-])(emulator|sandbox|bench)([/.-]|$)/.test(f))).toEqual(
      [],
    );
    const devToolNames =
      /\b(ProviderEmulator|SecretsManagerEmulator|ServiceAccountIssuer|EmulatorHttpServer|startAuthBrokers|benchOrders)\b|require\("[./]*\/(emulator|sandbox|bench)\//;
    expect(
      distFiles.filter(
        (f) =>
          f.endsWith('.js') && devToolNames.test(readFileSync(join(appDir, 'dist', f), 'utf8')),
      ),
    ).toEqual([]);
  });

  it('starts from a read-only tree, as the image user, and becomes ready', async () => {
    // The stack's folder (its config and credentials) goes inside the scratch directory, which
    // the image's user can traverse; the app is added once its tree and files are in place.
    stack = await startStack({
      name: 'runtime-stage',
      tmpdir: scratch,
      clients: [{ id: CLIENT_ID, credentials: CREDENTIALS }],
      callerAuth: {
        mode: 'api-key',
        callers: {
          'runtime-stage-test': { clients: [CLIENT_ID], key: API_KEY },
          'runtime-stage-ops': { clients: ['*'], scopes: ['admin'], key: OPS_KEY },
        },
      },
      replicas: 0,
    });
    emulator = stack.provider;
    const home = join(scratch, 'home');
    mkdirSync(join(home, 'tmp'), { recursive: true, mode: 0o700 });
    // `node` and nothing else on PATH: the runtime stage has no npm. A copy, not a link: the
    // unprivileged user must not need to traverse the folders above this one (a clone under
    // root's 0700 home would give EACCES).
    const bin = join(scratch, 'bin');
    mkdirSync(bin);
    copyFileSync(process.execPath, join(bin, 'node'));
    chmodSync(join(bin, 'node'), 0o755);

    const asRoot = process.getuid?.() === 0;
    if (asRoot && runtimeUser) {
      const stackFiles = readdirSync(stack.dir).map((f) => join(stack!.dir, f));
      for (const path of [home, join(home, 'tmp'), stack.dir, ...stackFiles]) {
        chownSync(path, runtimeUser.uid, runtimeUser.gid);
      }
    }
    chmodTree(appDir, (mode) => mode & ~0o222);
    // Root ignores file modes, so the read-only check means something only as another user.
    expect(asRoot ? runtimeUser?.uid : process.getuid?.()).not.toBe(0);

    // The image's CMD from its WORKDIR, as its USER, on its ENV and what a deployment sets:
    // the stack's test tuning is dropped. Resolves once GET /health/ready answers 200.
    const broker = await stack.addBroker({
      name: 'runtime-stage',
      command: {
        argv: cmd,
        cwd: appDir,
        ...(asRoot && runtimeUser ? { uid: runtimeUser.uid, gid: runtimeUser.gid } : {}),
      },
      env: {
        ...runtimeEnv,
        PATH: bin,
        HOME: home,
        TMPDIR: join(home, 'tmp'),
        LOG_LEVEL: 'info',
        TOKEN_MIN_REFRESH_INTERVAL_MS: undefined,
        AUDIT_INTERVAL_SECONDS: undefined,
      },
    });
    app = broker.process!;
    void app.exited.then(({ code, signal }) => (appExit = { code, signal }));
    baseUrl = broker.url;
    if (asRoot && runtimeUser && existsSync(`/proc/${app.pid}/status`)) {
      // Real, effective, saved and filesystem uid: the process really is the image's user.
      const uids = /^Uid:\s+(.*)$/m.exec(readFileSync(`/proc/${app.pid}/status`, 'utf8'))?.[1];
      expect(uids?.split(/\s+/).map(Number)).toEqual(Array(4).fill(runtimeUser.uid));
    }
    const ready = (await (await fetch(`${baseUrl}/health/ready`)).json()) as { status: string };
    expect(ready.status).toBe('ok');
    expect(emulator.stats.tokensIssued).toBeGreaterThanOrEqual(1);

    // And it serves the provider's token to an authenticated caller.
    const res = await fetch(`${baseUrl}/token?client=${CLIENT_ID}`, {
      headers: { authorization: `Bearer ${API_KEY}` },
    });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { access_token: string; expires_in: number };
    expect(emulator.stats.issued.map((t) => t.token)).toContain(body.access_token);
    expect(body.expires_in).toBeGreaterThan(0);
    const appOutput = app.logs().join('\n');
    expect(appOutput).not.toContain(CREDENTIALS.client_secret);
    expect(appOutput).not.toContain(API_KEY);
  });

  it('labels HTTP metrics with route patterns, never raw URLs', async () => {
    expect((await fetch(`${baseUrl}/health/live?probe=raw-value-7f3a`)).status).toBe(200);
    expect((await fetch(`${baseUrl}/no-such-route-9c1e`)).status).toBe(404);
    expect((await fetch(`${baseUrl}/metrics`)).status).toBe(401);
    const scrape = await (
      await fetch(`${baseUrl}/metrics`, { headers: { authorization: `Bearer ${OPS_KEY}` } })
    ).text();
    expect(scrape).toMatch(
      /^token_broker_http_requests_total\{route="\/health\/ready",method="GET",status="200"\} [1-9]/m,
    );
    expect(scrape).toMatch(
      /^token_broker_http_requests_total\{route="\/health\/live",method="GET",status="200"\} 1$/m,
    );
    expect(scrape).toMatch(
      /^token_broker_http_requests_total\{route="unmatched",method="GET",status="404"\} 1$/m,
    );
    expect(scrape).not.toContain('raw-value-7f3a');
    expect(scrape).not.toContain('no-such-route-9c1e');
    expect(scrape).toMatch(
      new RegExp(`^token_broker_token_remaining_seconds\\{client="${CLIENT_ID}"\\} [1-9]`, 'm'),
    );
  });

  it('exits 0 on SIGTERM (node is PID 1 in the image: no init, the app handles the signal)', async () => {
    expect(app).toBeDefined();
    void app?.kill('SIGTERM');
    await waitUntil(
      'exit after SIGTERM',
      15_000,
      async () => appExit !== undefined,
      () => undefined,
    );
    expect(appExit).toEqual({ code: 0, signal: null });
  });
});
