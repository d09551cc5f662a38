import type { Attributes } from '@opentelemetry/api';

/** No key named, or credentials as arguments (`AUTH`, `HELLO`). */
const KEYLESS = new Set([
  'auth',
  'hello',
  'ping',
  'select',
  'info',
  'client',
  'script',
  'cluster',
  'command',
  'config',
  'time',
  'echo',
  'quit',
  'multi',
  'exec',
  'discard',
  'readonly',
  'role',
  'subscribe',
  'psubscribe',
  'ssubscribe',
  'unsubscribe',
  'punsubscribe',
  'sunsubscribe',
]);

const ALL_KEYS = new Set(['del', 'unlink', 'exists', 'touch', 'mget', 'watch']);

/** `EVAL script numkeys key... arg...` and its siblings. */
const SCRIPTED = new Set(['eval', 'evalsha', 'eval_ro', 'evalsha_ro', 'fcall', 'fcall_ro']);

/** Key names only: script arguments are token records and order answers, unfit for an exporter. */
export function redisStatement(command: string, args: ReadonlyArray<unknown>): string {
  const name = command.toLowerCase();
  return [name, ...redisKeys(name, args).map(String)].join(' ');
}

function redisKeys(name: string, args: ReadonlyArray<unknown>): ReadonlyArray<unknown> {
  if (KEYLESS.has(name)) return [];
  if (ALL_KEYS.has(name)) return args;
  if (SCRIPTED.has(name)) {
    const count = Number(args[1]);
    return Number.isInteger(count) && count > 0 ? args.slice(2, 2 + count) : [];
  }
  return args.slice(0, 1);
}

/** Without the query string: passthrough callers put what they like there (customer ids). */
export function outgoingUrlAttributes(request: { origin: string; path: string }): Attributes {
  const url = new URL(request.path, request.origin);
  url.search = '';
  url.hash = '';
  return { 'url.full': url.toString(), 'url.query': undefined };
}
