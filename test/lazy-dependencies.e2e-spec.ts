import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ProviderEmulator } from '../emulator/provider-emulator';
import {
  SecretsManagerEmulator,
  secretsManagerClientEnv,
} from '../emulator/secrets-manager-emulator';
import { ServiceAccountIssuer } from '../emulator/service-account-issuer';
import { spawnBroker } from './support/broker-process';

const CREDS = { client_id: 'lazy-merchant', client_secret: randomBytes(12).toString('hex') };
const SECRET_ID = 'token-broker/lazy-credentials';
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
 * read from Secrets Manager, the JWT stack in kubernetes caller-auth mode. Each case starts
 * `node dist/main.js` with a preload that writes every module in `require.cache` when the
 * process exits, serves one authenticated `GET /token` (so the configured stack is proven to
 * work, not just to load), stops it with SIGTERM and reads the list. The same list shows that
 * what runs is the bundle, with the packages it leaves outside loaded from node_modules only
 * as before.
 */
jest.setTimeout(60_000);

describe('dependencies loaded per configuration (real brokers)', () => {
  const apiKey = randomBytes(32).toString('base64url');
  let provider: ProviderEmulator;
  let secrets: SecretsManagerEmulator;
  let issuer: ServiceAccountIssuer;
  let dir: string;
  let preload: string;

  beforeAll(async () => {
    provider = await ProviderEmulator.start({
      credentials: { [CREDS.client_id]: CREDS.client_secret },
    });
    secrets = await SecretsManagerEmulator.start({
      secrets: { [SECRET_ID]: JSON.stringify(CREDS) },
    });
    issuer = await ServiceAccountIssuer.start();
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

  afterAll(async () => {
    await Promise.all([provider?.close(), secrets?.close(), issuer?.close()]);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** Starts a broker, gets one token as `authorization`, stops it; returns the loaded modules. */
  async function modulesOf(
    name: string,
    env: Record<string, string | undefined>,
    authorization: string,
  ): Promise<string[]> {
    const out = join(dir, `${name}.json`);
    const credentialsFile = join(dir, 'credentials.json');
    writeFileSync(credentialsFile, JSON.stringify(CREDS), { mode: 0o600 });
    const broker = await spawnBroker({
      name,
      env: {
        CLIENT_ID: 'lazy',
        PROVIDER_AUTH_URL: provider.url,
        PROVIDER_BASE_URL: provider.url,
        CREDENTIALS_FILE: credentialsFile,
        HOST: '127.0.0.1',
        LOG_LEVEL: 'warn',
        NODE_OPTIONS: `--require ${preload}`,
        LOADED_MODULES_FILE: out,
        ...env,
      },
    });
    try {
      await broker.waitReady();
      const res = await fetch(`${broker.url}/token`, { headers: { authorization } });
      expect(res.status).toBe(200);
    } finally {
      const exit = await broker.stop();
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

  const apiKeyEnv = () => {
    const keys = join(dir, 'api-keys.json');
    writeFileSync(
      keys,
      JSON.stringify([
        {
          name: 'checkout',
          sha256: createHash('sha256').update(apiKey).digest('hex'),
          clients: ['*'],
        },
      ]),
      { mode: 0o600 },
    );
    return { CALLER_AUTH_MODE: 'api-key', CALLER_API_KEYS_FILE: keys };
  };

  const kubernetesEnv = () => ({
    CALLER_AUTH_MODE: 'kubernetes',
    CALLER_AUTH_JWKS_URL: issuer.jwksUrl,
    CALLER_AUTH_ISSUER: issuer.issuer,
    CALLER_AUTH_AUDIENCE: issuer.audience,
    CALLER_AUTH_SUBJECTS: JSON.stringify({ [SUBJECT]: ['*'] }),
  });

  it('dist/main.js is pure ASCII, so V8 holds its source at one byte a character', () => {
    const bundle = readFileSync(join(ROOT, 'dist', 'main.js'));
    expect(bundle.length).toBeGreaterThan(0);
    expect(bundle.findIndex((byte) => byte > 0x7f)).toBe(-1);
  });

  it('file credentials and api-key callers load neither the AWS SDK nor jose', async () => {
    const modules = await modulesOf('file-api-key', apiKeyEnv(), `Bearer ${apiKey}`);
    expect(modules.filter((m) => AWS_SDK.test(m))).toEqual([]);
    expect(modules.filter((m) => JOSE.test(m))).toEqual([]);
    // No OTEL_* variables: the OpenTelemetry SDK and its instrumentations stay unloaded.
    expect(modules.filter((m) => OTEL_SDK.test(m))).toEqual([]);
  });

  it('a Secrets Manager secret id loads the AWS SDK, and only it', async () => {
    const modules = await modulesOf(
      'aws-api-key',
      {
        ...apiKeyEnv(),
        CREDENTIALS_FILE: undefined,
        CREDENTIALS_SECRET_ID: SECRET_ID,
        ...secretsManagerClientEnv(secrets.url),
      },
      `Bearer ${apiKey}`,
    );
    expect(modules.some((m) => AWS_SDK.test(m))).toBe(true);
    expect(modules.filter((m) => JOSE.test(m))).toEqual([]);
    expect(secrets.stats.bySecret[SECRET_ID]).toBeGreaterThanOrEqual(1);
  });

  it('kubernetes mode loads jose, and only it', async () => {
    const token = await issuer.token({ subject: SUBJECT });
    const modules = await modulesOf('file-kubernetes', kubernetesEnv(), `Bearer ${token}`);
    expect(modules.some((m) => JOSE.test(m))).toBe(true);
    expect(modules.filter((m) => AWS_SDK.test(m))).toEqual([]);
  });
});
