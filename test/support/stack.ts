import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SyntheticModule } from 'node:vm';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { ProviderEmulator, type ProviderKnobs } from '../../emulator/provider-emulator';
import {
  SecretsManagerEmulator,
  secretsManagerClientEnv,
} from '../../emulator/secrets-manager-emulator';
import { ServiceAccountIssuer } from '../../emulator/service-account-issuer';
import { type BrokerCommand, type BrokerProcess, spawnBroker } from './broker-process';
import { freePort } from './ports';
import type { TestRedis } from './redis/standalone';
import { type RedisTopology, startTopology, type TopologyKind } from './redis/topology';
import { waitFor } from './wait';

/** A fresh API key. */
export const newKey = (): string => randomBytes(32).toString('base64url');
/** Hex SHA-256, as the broker stores API keys. */
export const sha256 = (text: string): string => createHash('sha256').update(text).digest('hex');

/**
 * A client's credentials document, as the broker reads it from its file or secret: a client
 * secret, or the key (`private_key_jwt`) or certificate and key (`tls_client_auth`) of a client
 * whose `tokenRequest` says so.
 */
export type StackCredentials = { client_id: string; client_secret?: string } & Record<
  string,
  unknown
>;

/** A provider client of the stack. */
export interface StackClient {
  id: string;
  /**
   * The broker is given a secret the provider does not know: no token can ever be had, so
   * readiness is polled on the other clients' tokens instead of `/health/ready`.
   * @default false
   */
  refused?: boolean;
  /**
   * The merchant credentials the provider knows (with a `client_secret`) and the broker is
   * given; for a client of another authorization server (`config.tokenRequest`), whatever that
   * server expects.
   * @default a generated `<merchant>-merchant` id and secret
   */
  credentials?: StackCredentials;
  /**
   * Where this client's credentials are kept, when not where the stack keeps the others'.
   * @default the stack's {@link StackOptions.secrets}
   */
  secrets?: 'file' | 'secrets-manager';
  /**
   * More of the client's config entry (`ordersPath`, `forward`), or overrides (`baseUrl`, or
   * `authUrl` and `tokenRequest` for another authorization server).
   */
  config?: Record<string, unknown>;
}

/** An API-key caller: the clients it may use and its scopes (absent: the default ones). */
export interface StackCaller {
  clients: string[];
  scopes?: string[];
  /** Its grant's `forwardAllow` rules; @default none (the clients' allow-lists alone) */
  forwardAllow?: Record<string, unknown>[];
  /** Its API key; @default a generated one */
  key?: string;
}

/** Caller authentication of the stack's brokers. */
export interface StackCallerAuth {
  /** Mode of the brokers {@link startStack} starts; {@link Stack.addBroker} may start others. */
  mode: 'none' | 'api-key' | 'kubernetes';
  /** API-key callers by name, with their keys in {@link Stack.keys}. */
  callers?: Record<string, StackCaller>;
  /**
   * Service-account subjects and the clients each may use. Given, a service-account issuer
   * (a local JWKS) is started and the config's `callerAuth.kubernetes` points at it, whatever
   * the mode: a broker in mode `kubernetes` can then be added beside api-key ones.
   */
  subjects?: Record<string, string[]>;
}

/** How to start a {@link Stack}. */
export interface StackOptions {
  /**
   * Label of the brokers and prefix of the stack's temporary folder.
   * @default 'stack'
   */
  name?: string;
  /**
   * Provider clients, each with its own merchant credentials, all on one provider emulator.
   * @default ['acme-prod']
   */
  clients?: readonly (string | StackClient)[];
  /**
   * Where the client secrets and the callers' key hashes are kept: files the config names
   * (`credentials.file`, `callerAuth.apiKeys`), or a Secrets Manager emulator the brokers read
   * through the real AWS SDK (`credentials.secretId`, `CALLER_API_KEYS_SECRET_ID`). A client's
   * own {@link StackClient.secrets} overrides it for that client.
   * @default 'file'
   */
  secrets?: 'file' | 'secrets-manager';
  /**
   * The token store: none (the in-memory store), a Redis of a topology the stack starts and
   * stops, or one the caller started and stops itself.
   * @default undefined (in memory)
   */
  redis?: TopologyKind | TestRedis | RedisTopology;
  /** @default { mode: 'none' } */
  callerAuth?: StackCallerAuth;
  /**
   * Encrypt what the brokers keep in Redis: `true` with a random key, a string with that file
   * content (a base64 key or a keyring), in a file the brokers are given (`CACHE_KEY_FILE`).
   * @default false
   */
  cacheKey?: boolean | string;
  /**
   * Brokers started at once, sharing the config (and Redis, if any); `0` for a suite that
   * starts each with {@link Stack.addBroker}.
   * @default 1
   */
  replicas?: number;
  /**
   * Run the brokers inside the Jest process (`createBrokerApp` on the very config a process
   * would read) rather than as `node dist/main.js`. Use processes when the process is the
   * subject: signals, crashes, exit codes, what `main.ts` alone logs, clock skew, fleets.
   * @default false
   */
  inProcess?: boolean;
  /**
   * Every broker also has an admin listener (`ADMIN_PORT`, a free port) at
   * {@link StackBroker.adminUrl}, where readiness answers its full report.
   * @default false
   */
  admin?: boolean;
  /** Added to (or overriding) every broker's environment. */
  env?: Record<string, string>;
  /** Provider emulator behaviour. */
  knobs?: Partial<ProviderKnobs>;
  /**
   * Folder the stack's temporary folder is made in: one another user can reach, for a broker
   * started as that user ({@link AddBrokerOptions.command}). The stack's folder is still 0700
   * and removed by {@link Stack.close}.
   * @default os.tmpdir() (the test run's own folder)
   */
  tmpdir?: string;
}

/** One broker of a stack, in-process or a child process alike. */
export interface StackBroker {
  readonly name: string;
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  /** `http://127.0.0.1:<admin port>` with {@link StackOptions.admin}; `undefined` otherwise. */
  readonly adminUrl: string | undefined;
  /** Its log lines (JSON), oldest first. */
  logs(): string[];
  /** The child process; `undefined` in-process. */
  readonly process: BrokerProcess | undefined;
  /** The Nest application; `undefined` for a child process. */
  readonly app: NestFastifyApplication | undefined;
  /** Closes the app, or stops the process gracefully (SIGTERM). */
  stop(): Promise<void>;
}

/** How to add a broker to a running stack. */
export interface AddBrokerOptions {
  /** Label; @default `${name}-<n>` */
  name?: string;
  /** Added to (or overriding, or unsetting with `undefined`) the stack's environment. */
  env?: Record<string, string | undefined>;
  /** @default the stack's */
  inProcess?: boolean;
  /**
   * What to wait for: readiness (as {@link startStack} does), the listener only, or nothing.
   * @default 'ready'
   */
  wait?: 'ready' | 'listening' | 'none';
  /**
   * A process other than `node dist/main.js`: a built image's `CMD`, from its folder, as its
   * user, on the stack's and the broker's `env` alone (see {@link BrokerCommand}).
   */
  command?: BrokerCommand;
}

/** A provider emulator, credentials, config, an optional Redis, and brokers on them. */
export interface Stack {
  provider: ProviderEmulator;
  /** With `secrets: 'secrets-manager'` only. */
  secrets: SecretsManagerEmulator | undefined;
  /** With `callerAuth.subjects` only. */
  issuer: ServiceAccountIssuer | undefined;
  redis: TestRedis | RedisTopology | undefined;
  /** The stack's temporary folder (config, credentials files), removed by {@link close}. */
  dir: string;
  configFile: string;
  /** Environment every broker of the stack starts with. */
  env: Record<string, string>;
  /** The brokers started and added, in that order. */
  brokers: StackBroker[];
  /** The first broker (`undefined` until one is started, with `replicas: 0`). */
  broker: StackBroker;
  /** The API key of each caller in `callerAuth.callers`, given or generated. */
  keys: Record<string, string>;
  /**
   * Each client's `{client_id, client_secret}` as the broker was given them; a client given no
   * `client_secret` (a key, a certificate) is not here.
   */
  credentials: Record<string, { client_id: string; client_secret: string }>;
  /** Every secret the set-up made (provider secrets, API keys): none may leak. */
  secretValues: string[];
  /** Starts one more broker on the stack's config. */
  addBroker(opts?: AddBrokerOptions): Promise<StackBroker>;
  /** Stops every broker, the emulators and a Redis it started; removes its folder. */
  close(): Promise<void>;
}

/**
 * The one harness every end-to-end suite starts its brokers with: a provider emulator knowing
 * each client's merchant credentials, those credentials (and the callers' key hashes) in files
 * or a Secrets Manager emulator, a `BROKER_CONFIG_FILE`, a Redis of any topology or none, and
 * `replicas` brokers, in the Jest process or as processes, awaited ready. `close()` tears all of
 * it down; on a failed start what was started is torn down before the error is thrown.
 */
export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  const name = opts.name ?? 'stack';
  const clients = (opts.clients ?? ['acme-prod']).map((c) =>
    typeof c === 'string' ? { id: c } : c,
  );
  const callerAuth = opts.callerAuth ?? { mode: 'none' };
  const callers = callerAuth.callers ?? {};
  const keys = Object.fromEntries(
    Object.entries(callers).map(([caller, grant]) => [caller, grant.key ?? newKey()]),
  );
  const useSecretsManager = opts.secrets === 'secrets-manager';
  const credentials: Record<string, StackCredentials> = Object.fromEntries(
    clients.map(({ id, credentials: given }) => {
      const merchant = id.replace(/-prod$/, '');
      return [
        id,
        given ?? {
          client_id: `${merchant}-merchant`,
          client_secret: `${merchant}-${randomBytes(12).toString('hex')}`,
        },
      ];
    }),
  );
  const inSecretsManager = (client: StackClient) =>
    (client.secrets ?? opts.secrets) === 'secrets-manager';
  // The clients the provider emulator knows: those of another server may have no secret.
  const withSecret = Object.fromEntries(
    Object.entries(credentials).flatMap(([id, { client_id, client_secret }]) =>
      client_secret === undefined ? [] : [[id, { client_id, client_secret }]],
    ),
  );
  const teardown: (() => Promise<void>)[] = [];
  const brokers: StackBroker[] = [];
  // Once, however often it is called; `brokers` stays readable after it.
  let closed: Promise<void> | undefined;
  const close = () =>
    (closed ??= (async () => {
      await Promise.all(brokers.map((b) => b.stop()));
      for (const step of teardown.splice(0).reverse()) await step();
    })());

  try {
    const provider = await ProviderEmulator.start({
      credentials: Object.fromEntries(
        clients
          .filter(({ id }) => id in withSecret)
          .map(({ id, refused }) => {
            const { client_id, client_secret } = withSecret[id];
            // A refused client's broker holds a secret other than the one the provider knows.
            return [client_id, refused ? `the-real-${client_secret}` : client_secret];
          }),
      ),
      knobs: opts.knobs,
    });
    teardown.push(() => provider.close());
    const dir = mkdtempSync(join(opts.tmpdir ?? tmpdir(), `tb-${name}-`));
    teardown.push(async () => rmSync(dir, { recursive: true, force: true }));

    const apiKeyGrants = Object.entries(callers).map(([caller, grant]) => ({
      name: caller,
      sha256: sha256(keys[caller]),
      clients: grant.clients,
      ...(grant.scopes && { scopes: grant.scopes }),
      ...(grant.forwardAllow && { forwardAllow: grant.forwardAllow }),
    }));
    const secretId = (what: string) => `token-broker/${what}`;
    let secrets: SecretsManagerEmulator | undefined;
    if (useSecretsManager || clients.some(inSecretsManager)) {
      secrets = await SecretsManagerEmulator.start({
        secrets: {
          ...Object.fromEntries(
            clients
              .filter(inSecretsManager)
              .map(({ id }) => [secretId(id), JSON.stringify(credentials[id])]),
          ),
          ...(useSecretsManager && {
            [secretId('caller-api-keys')]: JSON.stringify(apiKeyGrants),
          }),
        },
      });
      const started = secrets;
      teardown.push(() => started.close());
    }
    const issuer = callerAuth.subjects ? await ServiceAccountIssuer.start() : undefined;
    if (issuer) teardown.push(() => issuer.close());

    let redis: TestRedis | RedisTopology | undefined;
    if (typeof opts.redis === 'string') {
      const started = await startTopology(opts.redis);
      teardown.push(() => started.stop());
      redis = started;
    } else {
      redis = opts.redis;
    }

    const configFile = join(dir, 'broker.json');
    writeFileSync(
      configFile,
      JSON.stringify({
        clients: clients.map((client) => {
          const { id, config } = client;
          let source: { secretId: string } | { file: string };
          if (inSecretsManager(client)) {
            source = { secretId: secretId(id) };
          } else {
            const file = join(dir, `${id}.credentials.json`);
            writeFileSync(file, JSON.stringify(credentials[id]), { mode: 0o600 });
            source = { file };
          }
          return {
            id,
            authUrl: provider.url,
            baseUrl: provider.url,
            credentials: source,
            ...config,
          };
        }),
        callerAuth: {
          ...(!useSecretsManager && apiKeyGrants.length > 0 && { apiKeys: apiKeyGrants }),
          ...(issuer && {
            kubernetes: {
              jwksUrl: issuer.jwksUrl,
              issuer: issuer.issuer,
              audience: 'token-broker',
              subjects: callerAuth.subjects,
            },
          }),
        },
      }),
    );
    const cacheKeyFile = join(dir, 'cache-key');
    if (opts.cacheKey !== undefined && opts.cacheKey !== false) {
      const content = opts.cacheKey === true ? randomBytes(32).toString('base64') : opts.cacheKey;
      writeFileSync(cacheKeyFile, content, { mode: 0o600 });
    }
    const env: Record<string, string> = {
      // Unset is production; a suite about production behaviour sets it in `opts.env`.
      NODE_ENV: 'test',
      BROKER_CONFIG_FILE: configFile,
      HOST: '127.0.0.1',
      LOG_LEVEL: 'debug',
      CALLER_AUTH_MODE: callerAuth.mode,
      ...(callerAuth.mode === 'none' && { CALLER_AUTH_ALLOW_NONE: 'true' }),
      ...(secrets && {
        ...secretsManagerClientEnv(secrets.url),
        ...(useSecretsManager &&
          apiKeyGrants.length > 0 && { CALLER_API_KEYS_SECRET_ID: secretId('caller-api-keys') }),
      }),
      ...(redis && ('env' in redis ? redis.env() : { REDIS_URL: redis.url })),
      ...(opts.cacheKey !== undefined &&
        opts.cacheKey !== false && { CACHE_KEY_FILE: cacheKeyFile }),
      // Some suites run on tokens of seconds; the default floor between two grants (5 s) is
      // for production lifetimes.
      TOKEN_MIN_REFRESH_INTERVAL_MS: '500',
      // Aggregated audit lines every second rather than 10: tests wait for them.
      AUDIT_INTERVAL_SECONDS: '1',
      ...opts.env,
    };

    const stack: Stack = {
      provider,
      secrets,
      issuer,
      redis,
      dir,
      configFile,
      env,
      brokers,
      broker: undefined as unknown as StackBroker,
      keys,
      credentials: withSecret,
      secretValues: [
        ...Object.values(withSecret).map((c) => c.client_secret),
        ...Object.values(keys),
      ],
      async addBroker(add: AddBrokerOptions = {}): Promise<StackBroker> {
        const broker = await launch(add.name ?? `${name}-${brokers.length}`, add);
        brokers.push(broker);
        if ((add.wait ?? 'ready') !== 'none') await serving(broker, add);
        return broker;
      },
      close,
    };
    /** Starts a broker on the stack's config (plus `add.env`), without waiting for it. */
    async function launch(label: string, add: AddBrokerOptions): Promise<StackBroker> {
      const brokerEnv = { ...env, ...add.env };
      const admin = opts.admin ?? false;
      if (!add.command && (add.inProcess ?? opts.inProcess ?? false)) {
        useAwsEnv(brokerEnv, teardown);
        return startInProcess(label, brokerEnv, admin);
      }
      return startProcess(label, brokerEnv, admin, add.command);
    }
    const serving = (broker: StackBroker, add: AddBrokerOptions) =>
      waitServing(broker, add.wait === 'listening' ? 'listening' : 'ready', {
        mode: (add.env?.CALLER_AUTH_MODE ?? env.CALLER_AUTH_MODE) as StackCallerAuth['mode'],
        clients,
        callers,
        keys,
        processReady: broker.process,
      });
    // All at once, as a rollout starts them; kept in order, so `brokers[i]` is `${name}-${i}`.
    const started = await Promise.allSettled(
      Array.from({ length: opts.replicas ?? 1 }, (_, i) => launch(`${name}-${i}`, {})),
    );
    for (const r of started) if (r.status === 'fulfilled') brokers.push(r.value);
    for (const r of started) if (r.status === 'rejected') throw r.reason;
    await Promise.all(brokers.map((b) => serving(b, {})));
    stack.broker = brokers[0];
    return stack;
  } catch (err) {
    await close();
    throw err;
  }
}

async function startProcess(
  name: string,
  env: Record<string, string | undefined>,
  admin: boolean,
  command: BrokerCommand | undefined,
): Promise<StackBroker> {
  const proc = await spawnBroker({ name, env, admin, command });
  return {
    name,
    url: proc.url,
    port: proc.port,
    adminUrl: proc.adminUrl,
    logs: () => proc.logs(),
    process: proc,
    app: undefined,
    async stop() {
      await proc.stop();
    },
  };
}

/**
 * The AWS SDK reads its endpoint and credentials from `process.env`, in a broker process and in
 * this one alike: an in-process broker's `AWS_*` settings are set here until the stack closes
 * (Jest gives each test file its own `process.env`). Once per stack; all its brokers share them.
 */
function useAwsEnv(
  env: Record<string, string | undefined>,
  teardown: (() => Promise<void>)[],
): void {
  const aws = Object.entries(env).filter(([k]) => k.startsWith('AWS_'));
  if (aws.length === 0 || aws.every(([k, v]) => process.env[k] === v)) return;
  const previous = aws.map(([k]) => [k, process.env[k]] as const);
  for (const [k, v] of aws) process.env[k] = v;
  teardown.push(async () => {
    for (const [k, v] of previous) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
}

/**
 * The app inside this process, on the config a process would load from `env` (and nothing else
 * of this process's environment), logging into memory.
 */
async function startInProcess(
  name: string,
  env: Record<string, string | undefined>,
  admin: boolean,
): Promise<StackBroker> {
  // Imported here: the app's modules (NestJS is ES modules only) load only for suites that run
  // it in-process, on a Node that can (see scripts/test.mjs).
  if (typeof SyntheticModule !== 'function') {
    throw new Error(
      `${name}: an in-process broker needs Node >= 24.9 with --experimental-vm-modules ` +
        `(this is ${process.version}); run the tests with \`npm test\` or \`node scripts/test.mjs <files>\``,
    );
  }
  const { loadConfig } = await import('../../src/config/config.loader');
  const { createLogger } = await import('../../src/logging/logger');
  const { createBrokerApp } = await import('../../src/bootstrap');
  let port = 0;
  let adminPort: number | undefined;
  let lines: string[] = [];
  let app: NestFastifyApplication | undefined;
  // A port free a moment ago can be taken (another worker's process, an outgoing connection)
  // while the app is built: then the next ports, unless the test chose the port.
  for (let attempt = 1; app === undefined; attempt++) {
    port = env.PORT !== undefined ? Number(env.PORT) : await freePort();
    adminPort = admin ? await freePort() : undefined;
    lines = [];
    try {
      const brokerEnv = {
        ...env,
        PORT: String(port),
        ...(adminPort !== undefined && { ADMIN_PORT: String(adminPort) }),
      };
      const config = loadConfig(brokerEnv);
      const logger = createLogger(config.log.level, {
        write(chunk: string) {
          for (const line of chunk.split('\n')) if (line !== '') lines.push(line);
        },
      });
      const built = await createBrokerApp(config, logger, brokerEnv);
      await built.listen({ port: config.http.port, host: config.http.host }).catch(async (err) => {
        await built.close();
        throw err;
      });
      app = built;
    } catch (err) {
      const taken = (err as NodeJS.ErrnoException | undefined)?.code === 'EADDRINUSE';
      if (taken && env.PORT === undefined && attempt < 3) continue;
      // What main.ts would print before exiting: the error, then the log lines.
      const reason = err instanceof Error ? err.message : String(err);
      throw new Error(`${name} did not start in-process: ${reason}\n${lines.join('\n')}`, {
        cause: err,
      });
    }
  }
  let stopped: Promise<void> | undefined;
  return {
    name,
    url: `http://127.0.0.1:${port}`,
    port,
    adminUrl: adminPort !== undefined ? `http://127.0.0.1:${adminPort}` : undefined,
    logs: () => lines,
    process: undefined,
    app,
    stop() {
      stopped ??= app.close();
      return stopped;
    },
  };
}

/**
 * Waits until `broker` serves: `/health/ready` answering 200 when every client can get a token;
 * with a refused client (never ready, by design), each other client's token served to a caller
 * granted it (mode `api-key` or `none`), or the listener answering (mode `kubernetes`).
 */
async function waitServing(
  broker: StackBroker,
  wait: 'ready' | 'listening',
  ctx: {
    mode: StackCallerAuth['mode'];
    clients: StackClient[];
    callers: Record<string, StackCaller>;
    keys: Record<string, string>;
    processReady: BrokerProcess | undefined;
  },
): Promise<void> {
  const what = `${broker.name} at ${broker.url}`;
  const listening = async () =>
    (await fetch(`${broker.url}/health/live`).catch(() => ({ ok: false }))).ok || undefined;
  if (wait === 'listening' || (ctx.mode === 'kubernetes' && ctx.clients.some((c) => c.refused))) {
    await waitFor(listening, { timeoutMs: 20_000, what: `${what} listening` });
    return;
  }
  if (!ctx.clients.some((c) => c.refused)) {
    // A process's own wait quotes its output when it exits first.
    if (ctx.processReady) return ctx.processReady.waitReady(20_000);
    await waitFor(
      async () =>
        (await fetch(`${broker.url}/health/ready`).catch(() => ({ status: 0 }))).status === 200 ||
        undefined,
      { timeoutMs: 20_000, what: `${what} ready` },
    );
    return;
  }
  const readers = Object.entries(ctx.callers).filter(
    ([, grant]) => grant.scopes?.includes('token') ?? true,
  );
  await waitFor(
    async () => {
      const codes = await Promise.all(
        ctx.clients
          .filter((c) => !c.refused)
          .map(async ({ id }) => {
            const caller = readers.find(
              ([, grant]) => grant.clients.includes('*') || grant.clients.includes(id),
            )?.[0];
            if (ctx.mode === 'api-key' && caller === undefined) return 200;
            const headers: Record<string, string> =
              caller === undefined ? {} : { authorization: `Bearer ${ctx.keys[caller]}` };
            const res = await fetch(`${broker.url}/token?client=${id}`, { headers }).catch(
              () => undefined,
            );
            await res?.arrayBuffer();
            return res?.status ?? 0;
          }),
      );
      return codes.every((s) => s === 200) || undefined;
    },
    { timeoutMs: 20_000, what: `${what} serving tokens` },
  );
}
