import { closeSync, openSync, readSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { ZodError } from 'zod';
import { ConfigErrorCode, ConfigException } from './config.exception';
import { type BrokerConfig, brokerConfigSchema } from './config.schema';
import { looksLikeSettingName, shownReference } from './secret-reference';
import { envAlternatives, type EnvSetting, envSettings, settingFields } from './setting-meta';

type Path = readonly (string | number)[];

const fields = settingFields(brokerConfigSchema);
const CLIENT_PREFIX = ['clients', '[]'];
const inClient = (path: readonly string[]) => path[0] === 'clients';

/**
 * The variables of top-level settings, from the `env` metadata on the schema's fields: these
 * names are the broker's contract, deployments rely on them.
 */
export const ENV_SETTINGS: readonly EnvSetting[] = envSettings(fields).filter(
  ({ path }) => !inClient(path),
);

/** A setting nobody supplied is named by the variable(s) that would supply it. */
const UNSUPPLIED_NAMES = new Map<string, string>([
  ...ENV_SETTINGS.map(({ env, path }) => [path.join('.'), env] as [string, string]),
  ...[...envAlternatives(fields)].filter(([key]) => !key.startsWith('clients.')),
]);

/** They build `clients[0]` when the file defines no clients; paths inside the client. */
const CLIENT_ENV: readonly EnvSetting[] = envSettings(fields)
  .filter(({ path }) => inClient(path))
  .map(({ env, path }) => ({ env, path: path.slice(CLIENT_PREFIX.length) }));

/** Client path -> "A or B", e.g. `credentials` -> the two credentials variables. */
const CLIENT_ALTERNATIVES = [...envAlternatives(fields)]
  .filter(([key]) => key.startsWith(`${CLIENT_PREFIX.join('.')}.`))
  .map(([key, names]) => [key.split('.').slice(CLIENT_PREFIX.length), names] as const);

export const DEFAULT_CLIENT_ID = 'default';

/** Names every bad setting (by variable or file path), never echoing a value. */
export function loadConfig(env: Readonly<Record<string, string | undefined>>): BrokerConfig {
  const fileName = nonEmpty(env.BROKER_CONFIG_FILE);
  const raw: Record<string, unknown> = fileName ? readConfigFile(fileName) : {};
  const origins = new Map<string, string>();

  for (const { env: name, path } of ENV_SETTINGS) {
    const value = nonEmpty(env[name]);
    if (value === undefined) continue;
    setPath(raw, path, value);
    origins.set(path.join('.'), name);
  }

  const clientEnv = CLIENT_ENV.filter(({ env: name }) => nonEmpty(env[name]) !== undefined);
  if (raw.clients !== undefined) {
    if (clientEnv.length > 0) {
      throw ConfigException.of(ConfigErrorCode.Invalid, [
        `${clientEnv.map((c) => c.env).join(', ')}: the config file (BROKER_CONFIG_FILE) already defines clients; configure clients in one place only`,
      ]);
    }
  } else {
    const client: Record<string, unknown> = { id: DEFAULT_CLIENT_ID, credentials: {} };
    for (const { env: name, path } of CLIENT_ENV) {
      const value = nonEmpty(env[name]);
      if (value !== undefined) setPath(client, path, value);
      origins.set(['clients', 0, ...path].join('.'), name);
    }
    for (const [path, names] of CLIENT_ALTERNATIVES) {
      origins.set(['clients', 0, ...path].join('.'), names);
    }
    raw.clients = [client];
  }

  const result = brokerConfigSchema.safeParse(raw);
  if (!result.success) {
    throw ConfigException.of(
      ConfigErrorCode.Invalid,
      describeIssues(result.error, raw, origins, fileName && shownReference(fileName)),
      { cause: result.error },
    );
  }
  return result.data;
}

function describeIssues(
  error: ZodError,
  raw: Record<string, unknown>,
  origins: Map<string, string>,
  fileName: string | undefined,
): string[] {
  return error.issues.map((issue) => {
    const key = issue.path.map(String).join('.');
    const absent = getPath(raw, issue.path) === undefined;
    const unsupplied = absent ? UNSUPPLIED_NAMES.get(key) : undefined;
    const setting =
      originOf(origins, issue.path) ??
      (unsupplied && fileName
        ? `${unsupplied} (or ${formatPath(issue.path)} in ${fileName})`
        : unsupplied) ??
      (fileName
        ? issue.path.length > 0
          ? `${fileName}: ${formatPath(issue.path)}`
          : fileName
        : formatPath(issue.path));
    // Only the message, never the input: the offending value may be a misplaced secret.
    const missing = issue.code === 'invalid_type' && absent;
    const message =
      issue.code === 'unrecognized_keys'
        ? unknownKeys(issue.keys)
        : missing
          ? 'required'
          : issue.message;
    return `${setting}: ${message}`;
  });
}

/**
 * Zod's own message quotes every unknown key, and a secret pasted into the file as a key (or a
 * key and value on one line) would reach stderr: only keys that look like setting names are named.
 */
function unknownKeys(keys: readonly string[]): string {
  const named = keys.filter(looksLikeSettingName).map((k) => `"${k}"`);
  const hidden = keys.length - named.length;
  const parts = [
    ...named,
    ...(hidden === 0
      ? []
      : [hidden === 1 ? 'an unknown key (not shown)' : `${hidden} unknown keys (not shown)`]),
  ];
  return `unknown ${keys.length === 1 ? 'key' : 'keys'} ${parts.join(', ')}; check the spelling against docs/configuration.md`;
}

/** Its own, else the nearest enclosing one, else those that set fields inside it. */
function originOf(origins: Map<string, string>, path: readonly PropertyKey[]): string | undefined {
  for (let n = path.length; n > 0; n--) {
    const found = origins.get(path.slice(0, n).map(String).join('.'));
    if (found !== undefined) return found;
  }
  if (path.length === 0) return undefined;
  const prefix = `${path.map(String).join('.')}.`;
  const inside = [...origins].filter(([k]) => k.startsWith(prefix)).map(([, env]) => env);
  return inside.length > 0 ? [...new Set(inside)].join(', ') : undefined;
}

function getPath(root: unknown, path: readonly PropertyKey[]): unknown {
  let node = root;
  for (const key of path) {
    if (node === null || typeof node !== 'object') return undefined;
    node = (node as Record<PropertyKey, unknown>)[key];
  }
  return node;
}

/** A record's key (a subject, a header name) is printed only when it could be a name. */
function formatPath(path: readonly PropertyKey[]): string {
  return path
    .map((p, i) =>
      typeof p === 'number' ? `[${p}]` : `${i === 0 ? '' : '.'}${shownKey(String(p))}`,
    )
    .join('');
}

/** Names (`system:serviceaccount:shop:checkout`, `X-Tenant`), not what a secret looks like. */
function shownKey(key: string): string {
  return looksLikeSettingName(key) || shownReference(key) === key ? key : '(a key not shown)';
}

/** Hundreds of clients take tens of KiB; far more is a mistake, and YAML parsing grows with it. */
const CONFIG_FILE_MAX_BYTES = 1024 * 1024;

function readConfigFile(fileName: string): Record<string, unknown> {
  let text: string;
  try {
    text = readCapped(fileName, CONFIG_FILE_MAX_BYTES);
  } catch (cause) {
    if (cause instanceof ConfigException) throw cause;
    const reason = (cause as NodeJS.ErrnoException).code ?? 'unreadable';
    throw ConfigException.of(
      ConfigErrorCode.FileUnreadable,
      [`BROKER_CONFIG_FILE: cannot read the file (${reason}); check the path and permissions`],
      { cause },
    );
  }
  let parsed: unknown;
  try {
    // YAML is a superset of JSON, so one parser reads both formats.
    parsed = parseYaml(text);
  } catch (cause) {
    throw ConfigException.of(
      ConfigErrorCode.FileUnparsable,
      ['BROKER_CONFIG_FILE: not valid YAML or JSON'],
      { cause },
    );
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw ConfigException.of(ConfigErrorCode.FileUnparsable, [
      'BROKER_CONFIG_FILE: must hold a mapping (an object) at the top level',
    ]);
  }
  return parsed as Record<string, unknown>;
}

/** Reads rather than trusts `stat`: a FIFO or a device reports size 0 and never ends. */
function readCapped(fileName: string, limit: number): string {
  const fd = openSync(fileName, 'r');
  try {
    const buffer = Buffer.alloc(limit + 1);
    let length = 0;
    for (;;) {
      const n = readSync(fd, buffer, length, buffer.length - length, null);
      if (n === 0) break;
      length += n;
      if (length > limit) {
        throw ConfigException.of(ConfigErrorCode.FileUnreadable, [
          `BROKER_CONFIG_FILE: the file is over ${limit} bytes (1 MiB); it should hold clients and callers only, with secrets referenced, not inlined`,
        ]);
      }
    }
    return buffer.toString('utf8', 0, length);
  } finally {
    closeSync(fd);
  }
}

function setPath(target: Record<string, unknown>, path: Path, value: unknown): void {
  let node: Record<string | number, unknown> = target;
  path.slice(0, -1).forEach((key) => {
    const next = node[key];
    if (next === null || typeof next !== 'object') node[key] = {};
    node = node[key] as Record<string | number, unknown>;
  });
  node[path[path.length - 1]] = value;
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === '' ? undefined : value;
}
