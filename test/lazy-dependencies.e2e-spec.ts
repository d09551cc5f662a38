import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { type Stack, type StackOptions, startStack } from './support/stack';

const CLIENT = 'lazy';
const CREDS = { client_id: 'lazy-merchant', client_secret: randomBytes(12).toString('hex') };
/** Where a Secrets Manager stack keeps the client's credentials. */
const SECRET_ID = `token-broker/${CLIENT}`;
const SUBJECT = 'system:serviceaccount:shop:checkout';
const AWS_SDK = /\/node_modules\/@aws-sdk\/client-secrets-manager\//;
const JOSE = /\/node_modules\/jose\//;
const OTEL_SDK = /\/node_modules\/@opentelemetry\/(sdk-|instrumentation|exporter-)/;
/** Packages every configuration uses, inside dist/main.js (esbuild.config.mjs). */
const BUNDLED =
  /\/node_modules\/(@nestjs\/(common|core|platform-fastify|terminus)|fastify|rxjs|zod|undici|yaml|pino|prom-client)\//;
const ROOT = resolve(__dirname, '..');

/**
 * A replica loads only what its configuration uses (issue #17): the AWS SDK when a secret is
 * read from Secrets Manager, the JWT stack in kubernetes caller-auth mode. Each case starts a
 * stack whose broker is `node dist/main.js` (what a process loads is the subject: never
 * in-process) with a preload that writes every module in `require.cache` when the process
 * exits, serves one authenticated `GET /token` (so the configured stack is proven to work, not
 * just to load), stops it with SIGTERM and reads the list. The same list shows that what runs
 * is the bundle, with the packages it leaves outside loaded from node_modules only as before.
 */
jest.setTimeout(60_000);

describe('dependencies loaded per configuration (real brokers)', () => {
  const apiKey = randomBytes(32).toString('base64url');
  let set: Stack | undefined;
  let dir: string;
  let preload: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-lazy-deps-'));
    preload = join(dir, 'record-modules.js');
    // Plain JS for `node -r`; `exit` runs after main.ts's graceful shutdown calls process.exit.
    writeFileSync(
      preload,
      `const { writeFileSync } = require('node:fs');
process.once('exit', () => {
  writeFileSync(process.env.LOADED_MODULES_FILE, JSON.stringify(Object.keys(require.cache)));
});
`,
    );
  });

  afterEach(async () => {
    await set?.close();
    set = undefined;
  });

  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /**
   * Starts a stack of one broker process configured by `opts`, gets one token as
   * `authorization` says, stops it; returns the loaded modules.
   */
  async function modulesOf(
    name: string,
    opts: StackOptions,
    authorization: (stack: Stack) => string | Promise<string>,
  ): Promise<string[]> {
    const out = join(dir, `${name}.json`);
    set = await startStack({
      name,
      clients: [{ id: CLIENT, credentials: CREDS }],
      ...opts,
      env: { LOG_LEVEL: 'warn', NODE_OPTIONS: `--require ${preload}`, LOADED_MODULES_FILE: out },
    });
    const broker = set.broker;
    try {
      const res = await fetch(`${broker.url}/token`, {
        headers: { authorization: await authorization(set) },
      });
      expect(res.status).toBe(200);
    } finally {
      const exit = await broker.process!.stop();
      expect(exit.code).toBe(0);
    }
    const modules = JSON.parse(readFileSync(out, 'utf8')) as string[];
    // What runs is the bundle (esbuild.config.mjs): the broker's code is the one file
    // dist/main.js, and its framework and libraries come from inside it, not node_modules.
    const dist = join(ROOT, 'dist');
    expect(modules.filter((m) => m.startsWith(`${dist}/`))).toEqual([join(dist, 'main.js')]);
    expect(modules.filter((m) => BUNDLED.test(m))).toEqual([]);
    return modules;
  }

  /** The one API-key caller, granted every client. */
  const apiKeyAuth: StackOptions['callerAuth'] = {
    mode: 'api-key',
    callers: { checkout: { clients: ['*'], key: apiKey } },
  };

  it('dist/main.js is pure ASCII, so V8 holds its source at one byte a character', () => {
    const bundle = readFileSync(join(ROOT, 'dist', 'main.js'));
    expect(bundle.length).toBeGreaterThan(0);
    expect(bundle.findIndex((byte) => byte > 0x7f)).toBe(-1);
  });

  it('file credentials and api-key callers load neither the AWS SDK nor jose', async () => {
    const modules = await modulesOf(
      'file-api-key',
      { callerAuth: apiKeyAuth },
      () => `Bearer ${apiKey}`,
    );
    expect(modules.filter((m) => AWS_SDK.test(m))).toEqual([]);
    expect(modules.filter((m) => JOSE.test(m))).toEqual([]);
    // No OTEL_* variables: the OpenTelemetry SDK and its instrumentations stay unloaded.
    expect(modules.filter((m) => OTEL_SDK.test(m))).toEqual([]);
  });

  it('a Secrets Manager secret id loads the AWS SDK, and only it', async () => {
    const modules = await modulesOf(
      'aws-api-key',
      { callerAuth: apiKeyAuth, secrets: 'secrets-manager' },
      () => `Bearer ${apiKey}`,
    );
    expect(modules.some((m) => AWS_SDK.test(m))).toBe(true);
    expect(modules.filter((m) => JOSE.test(m))).toEqual([]);
    expect(set!.secrets!.stats.bySecret[SECRET_ID]).toBeGreaterThanOrEqual(1);
  });

  it('kubernetes mode loads jose, and only it', async () => {
    const modules = await modulesOf(
      'file-kubernetes',
      { callerAuth: { mode: 'kubernetes', subjects: { [SUBJECT]: ['*'] } } },
      async ({ issuer }) => `Bearer ${await issuer!.token({ subject: SUBJECT })}`,
    );
    expect(modules.some((m) => JOSE.test(m))).toBe(true);
    expect(modules.filter((m) => AWS_SDK.test(m))).toEqual([]);
  });
});
