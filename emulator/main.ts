import { readFileSync } from 'node:fs';
import {
  DEFAULT_PROVIDER_KNOBS,
  type OrdersFailure,
  PROVIDER_ORDERS_PATHS,
  PROVIDER_TOKEN_PATH,
  ProviderEmulator,
  type ProviderKnobs,
  type TokenFailure,
} from './provider-emulator';
import { SecretsManagerEmulator, secretsManagerClientEnv } from './secrets-manager-emulator';

/**
 * `npm run emulator`: the provider emulator on its own, for local trials with several broker
 * replicas (point each broker's PROVIDER_AUTH_URL and PROVIDER_BASE_URL at it). Options come
 * from flags (`--port 9090` or `--port=9090`) or the environment (`EMULATOR_PORT`); flags win.
 * One JSON line when listening, one with the counts when stopped (SIGTERM or Ctrl-C).
 *
 * `npm run emulator -- secrets --secret <id>=<file>`: the Secrets Manager emulator instead, serving
 * each file's content as the secret `<id>` (by name or ARN), to try a broker's `*_SECRET_ID`
 * settings locally; its listening line gives the AWS_* variables that point the SDK at it.
 */

/** What the command line and environment set. */
export interface EmulatorOptions {
  port: number;
  host: string;
  /** Accepted `client_id -> client_secret`. */
  credentials: Record<string, string>;
  knobs: ProviderKnobs;
}

/** The options: flag name, environment variable, meaning (for `--help` and errors). */
export const EMULATOR_OPTIONS: ReadonlyArray<{ flag: string; env: string; help: string }> = [
  { flag: 'port', env: 'EMULATOR_PORT', help: 'TCP port (0: a free one). Default 9090' },
  { flag: 'host', env: 'EMULATOR_HOST', help: 'interface to bind. Default 127.0.0.1' },
  {
    flag: 'client',
    env: 'EMULATOR_CLIENTS',
    help: 'accepted credentials as id:secret; repeat the flag, or comma-separate in the variable. Default emulator-merchant:emulator-only-secret',
  },
  {
    flag: 'token-lifetime',
    env: 'EMULATOR_TOKEN_LIFETIME_SECONDS',
    help: 'lifetime of issued tokens in seconds (0 or less: already expired). Default 1800',
  },
  {
    flag: 'expires-in',
    env: 'EMULATOR_EXPIRES_IN',
    help: 'how expires_in is sent: number, string or omit. Default number',
  },
  {
    flag: 'token-type',
    env: 'EMULATOR_TOKEN_TYPE',
    help: 'token_type value, or "none" to leave it out. Default Bearer',
  },
  {
    flag: 'token-latency-ms',
    env: 'EMULATOR_TOKEN_LATENCY_MS',
    help: 'delay before the token endpoint answers. Default 0',
  },
  {
    flag: 'orders-latency-ms',
    env: 'EMULATOR_ORDERS_LATENCY_MS',
    help: 'delay before the orders endpoints answer. Default 0',
  },
  {
    flag: 'token-failure',
    env: 'EMULATOR_TOKEN_FAILURE',
    help: 'every token request fails: status:<code>[:<retry-after>], timeout or reset. Default none',
  },
  {
    flag: 'orders-failure',
    env: 'EMULATOR_ORDERS_FAILURE',
    help: 'every order request fails: status:<code>, timeout, timeout-after-create or reset. Default none',
  },
];

/** A bad option: the message names it and says what is accepted. */
export class EmulatorOptionsError extends Error {}

/** Parses flags over environment variables; throws {@link EmulatorOptionsError}. */
export function parseEmulatorOptions(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
): EmulatorOptions {
  const flags = new Map<string, string[]>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const m = /^--([a-z-]+)(?:=(.*))?$/s.exec(arg);
    const known = m && EMULATOR_OPTIONS.some((o) => o.flag === m[1]);
    if (!m || !known) throw new EmulatorOptionsError(`unknown argument "${arg}"; see --help`);
    const value = m[2] ?? argv[++i];
    if (value === undefined) throw new EmulatorOptionsError(`--${m[1]} needs a value`);
    flags.set(m[1], [...(flags.get(m[1]) ?? []), value]);
  }
  const get = (flag: string): { value: string; from: string } | undefined => {
    const option = EMULATOR_OPTIONS.find((o) => o.flag === flag)!;
    const given = flags.get(flag);
    if (given) return { value: given[given.length - 1], from: `--${flag}` };
    const fromEnv = env[option.env];
    return fromEnv === undefined || fromEnv === ''
      ? undefined
      : { value: fromEnv, from: option.env };
  };
  const integer = (flag: string, fallback: number, min: number, max: number): number => {
    const v = get(flag);
    if (v === undefined) return fallback;
    const n = Number(v.value);
    if (!/^-?\d+$/.test(v.value) || n < min || n > max) {
      throw new EmulatorOptionsError(`${v.from} must be a whole number from ${min} to ${max}`);
    }
    return n;
  };

  const clientList = flags.get('client') ??
    get('client')?.value.split(',') ?? ['emulator-merchant:emulator-only-secret'];
  const credentials: Record<string, string> = {};
  for (const pair of clientList) {
    const colon = pair.indexOf(':');
    if (colon <= 0 || colon === pair.length - 1) {
      throw new EmulatorOptionsError(
        `client credentials must be id:secret (got "${pair.split(':')[0]}:…")`,
      );
    }
    credentials[pair.slice(0, colon)] = pair.slice(colon + 1);
  }

  const expiresIn = get('expires-in');
  if (expiresIn && !['number', 'string', 'omit'].includes(expiresIn.value)) {
    throw new EmulatorOptionsError(`${expiresIn.from} must be number, string or omit`);
  }
  const tokenType = get('token-type');
  return {
    port: integer('port', 9090, 0, 65_535),
    host: get('host')?.value ?? '127.0.0.1',
    credentials,
    knobs: {
      ...DEFAULT_PROVIDER_KNOBS,
      tokenLifetimeSeconds: integer('token-lifetime', 1800, -86_400, 86_400 * 365),
      expiresIn: (expiresIn?.value as ProviderKnobs['expiresIn'] | undefined) ?? 'number',
      tokenType:
        tokenType === undefined ? 'Bearer' : tokenType.value === 'none' ? null : tokenType.value,
      tokenLatencyMs: integer('token-latency-ms', 0, 0, 600_000),
      ordersLatencyMs: integer('orders-latency-ms', 0, 0, 600_000),
      tokenFailure: tokenFailure(get('token-failure')),
      ordersFailure: ordersFailure(get('orders-failure')),
    },
  };
}

function statusFailure(
  v: { value: string; from: string },
  withRetryAfter: boolean,
): { kind: 'status'; status: number; retryAfter?: string } {
  const [, code, retryAfter] = v.value.split(':');
  const status = Number(code);
  if (!/^\d{3}$/.test(code ?? '') || status < 400 || status > 599) {
    throw new EmulatorOptionsError(`${v.from}: status:<code> needs a 4xx or 5xx code`);
  }
  return withRetryAfter && retryAfter !== undefined
    ? { kind: 'status', status, retryAfter }
    : { kind: 'status', status };
}

function tokenFailure(v: { value: string; from: string } | undefined): TokenFailure | null {
  if (v === undefined || v.value === 'none') return null;
  if (v.value === 'timeout' || v.value === 'reset') return { kind: v.value };
  if (v.value.startsWith('status:')) return statusFailure(v, true);
  throw new EmulatorOptionsError(
    `${v.from} must be status:<code>[:<retry-after>], timeout, reset or none`,
  );
}

function ordersFailure(v: { value: string; from: string } | undefined): OrdersFailure | null {
  if (v === undefined || v.value === 'none') return null;
  if (v.value === 'timeout' || v.value === 'reset' || v.value === 'timeout-after-create') {
    return { kind: v.value };
  }
  if (v.value.startsWith('status:')) return statusFailure(v, false);
  throw new EmulatorOptionsError(
    `${v.from} must be status:<code>, timeout, timeout-after-create, reset or none`,
  );
}

/** What `npm run emulator -- secrets` serves, and where. */
export interface SecretsEmulatorOptions {
  port: number;
  host: string;
  /** Secret id (name) -> `SecretString`, read from the files given. */
  secrets: Record<string, string>;
}

/** The default port of the Secrets Manager emulator: LocalStack's, which AWS tooling knows. */
const SECRETS_DEFAULT_PORT = 4566;

/** Parses `secrets`' flags (`--secret id=file` repeatable, `--port`, `--host`). */
export function parseSecretsOptions(
  argv: readonly string[],
  readFile: (path: string) => string = (path) => readFileSync(path, 'utf8'),
): SecretsEmulatorOptions {
  const options: SecretsEmulatorOptions = {
    port: SECRETS_DEFAULT_PORT,
    host: '127.0.0.1',
    secrets: {},
  };
  for (let i = 0; i < argv.length; i++) {
    const m = /^--(port|host|secret)(?:=(.*))?$/s.exec(argv[i]);
    if (!m) throw new EmulatorOptionsError(`unknown argument "${argv[i]}"; see secrets --help`);
    const value = m[2] ?? argv[++i];
    if (value === undefined) throw new EmulatorOptionsError(`--${m[1]} needs a value`);
    if (m[1] === 'port') {
      if (!/^\d+$/.test(value) || Number(value) > 65_535) {
        throw new EmulatorOptionsError('--port must be a whole number from 0 to 65535');
      }
      options.port = Number(value);
    } else if (m[1] === 'host') {
      options.host = value;
    } else {
      const eq = value.indexOf('=');
      if (eq <= 0 || eq === value.length - 1) {
        throw new EmulatorOptionsError('--secret must be <secret id>=<file holding its value>');
      }
      const [id, file] = [value.slice(0, eq), value.slice(eq + 1)];
      try {
        options.secrets[id] = readFile(file);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code ?? String(err);
        throw new EmulatorOptionsError(`--secret ${id}: cannot read ${file} (${code})`);
      }
    }
  }
  if (Object.keys(options.secrets).length === 0) {
    throw new EmulatorOptionsError('secrets needs at least one --secret <secret id>=<file>');
  }
  return options;
}

function secretsUsage(): string {
  return [
    'npm run emulator -- secrets --secret <id>=<file> [--secret ...] [--port 4566] [--host 127.0.0.1]',
    '',
    "  Serves AWS Secrets Manager's GetSecretValue: each file's content is the secret <id>",
    '  (asked for by name, or as arn:aws:secretsmanager:us-east-1:000000000000:secret:<id>).',
    '  Point a broker at it with the AWS_* variables of its listening line, and e.g.',
    '  CREDENTIALS_SECRET_ID=<id>.',
    '',
  ].join('\n');
}

function usage(): string {
  return [
    'npm run emulator -- [options]   (options also from the environment)',
    '',
    ...EMULATOR_OPTIONS.map((o) => `  --${o.flag.padEnd(18)} ${o.env.padEnd(32)} ${o.help}`),
    '',
    `Token endpoint: POST <url>${PROVIDER_TOKEN_PATH}?grant_type=client_credentials (HTTP Basic)`,
    `Orders: POST <url>${PROVIDER_ORDERS_PATHS.join(' or <url>')} (Bearer token)`,
    '',
    'npm run emulator -- secrets --help: the Secrets Manager emulator instead',
    '',
  ].join('\n');
}

/** Parses with `parse`, or exits 64 (EX_USAGE) with the message as one JSON line. */
function parsedOrExit<T>(parse: () => T): T {
  try {
    return parse();
  } catch (err) {
    if (!(err instanceof EmulatorOptionsError)) throw err;
    process.stderr.write(`${JSON.stringify({ level: 'error', msg: err.message })}\n`);
    process.exit(64); // EX_USAGE
  }
}

const line = (fields: Record<string, unknown>) =>
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), ...fields })}\n`);

async function secretsMain(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(secretsUsage());
    return;
  }
  const options = parsedOrExit(() => parseSecretsOptions(argv));
  const emulator = await SecretsManagerEmulator.start(options);
  line({
    level: 'info',
    msg: 'secrets manager emulator listening',
    url: emulator.url,
    // Ids only: the values are the files' to hold.
    secretIds: Object.keys(options.secrets),
    env: secretsManagerClientEnv(emulator.url),
  });
  const stop = async (signal: NodeJS.Signals) => {
    const s = emulator.stats;
    await emulator.close();
    line({ level: 'info', msg: 'secrets manager emulator stopped', signal, ...s });
    process.exit(0);
  };
  process.once('SIGTERM', (s) => void stop(s));
  process.once('SIGINT', (s) => void stop(s));
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  if (argv[0] === 'secrets') return secretsMain(argv.slice(1));
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(usage());
    return;
  }
  const options = parsedOrExit(() => parseEmulatorOptions(argv, process.env));
  const emulator = await ProviderEmulator.start(options);
  line({
    level: 'info',
    msg: 'provider emulator listening',
    url: emulator.url,
    tokenUrl: `${emulator.url}${PROVIDER_TOKEN_PATH}`,
    ordersUrls: PROVIDER_ORDERS_PATHS.map((p) => `${emulator.url}${p}`),
    // Ids only: the secrets are the caller's to know.
    clients: Object.keys(options.credentials),
    knobs: options.knobs,
  });
  const stop = async (signal: NodeJS.Signals) => {
    const s = emulator.stats;
    await emulator.close();
    line({
      level: 'info',
      msg: 'provider emulator stopped',
      signal,
      tokenRequests: s.tokenRequests,
      tokensIssued: s.tokensIssued,
      rejectedTokenAuth: s.rejectedTokenAuth,
      orderRequests: s.orderRequests,
      ordersCreated: s.ordersCreated,
    });
    process.exit(0);
  };
  process.once('SIGTERM', (s) => void stop(s));
  process.once('SIGINT', (s) => void stop(s));
}

if (require.main === module) {
  main().catch((err: unknown) => {
    process.stderr.write(
      `${JSON.stringify({ level: 'error', msg: `provider emulator failed: ${err instanceof Error ? err.message : String(err)}` })}\n`,
    );
    process.exit(1);
  });
}
