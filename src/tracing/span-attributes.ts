import type { Attributes } from '@opentelemetry/api';

/** Commands that name no key, or whose arguments are credentials (`AUTH`, `HELLO`). */
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

/** Commands whose every argument is a key. */
const ALL_KEYS = new Set(['del', 'unlink', 'exists', 'touch', 'mget', 'watch']);

/** Scripts: `EVAL script numkeys key... arg...` and its siblings. */
const SCRIPTED = new Set(['eval', 'evalsha', 'eval_ro', 'evalsha_ro', 'fcall', 'fcall_ro']);

/**
 * The `db.query.text` of a Redis span: the command and the key names, never the other
 * arguments. Script arguments are the stored token records, lock values and order answers, and
 * a span exporter is not a place a sealed token or a stored order may go.
 */
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

/**
 * Attributes that replace the undici instrumentation's URL attributes: the URL without its query
 * string. Passthrough callers put what they like in a query (order references, customer ids);
 * the path and the host are enough to follow a request.
 */
export function outgoingUrlAttributes(request: { origin: string; path: string }): Attributes {
  const url = new URL(request.path, request.origin);
  url.search = '';
  url.hash = '';
  return { 'url.full': url.toString(), 'url.query': undefined };
}
