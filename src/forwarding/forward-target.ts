import type { ForwardMethod, ForwardRule } from '../config/client.schema';
import { ForwardErrorCode, ForwardException } from './forward.exception';

/** Where the passthrough lives: `/provider/<client>/<provider path>?<query>`. */
export const FORWARD_ROUTE_PREFIX = '/provider/';

/** A request target the passthrough accepted, split for the provider call. */
export interface ForwardTarget {
  /** The `<client>` segment as sent (the guard decides whether the caller may use it). */
  readonly clientId: string;
  /** The provider path, exactly as sent (percent-encoding kept), starting with `/`. */
  readonly path: string;
  /** The query string with its `?`, exactly as sent, or `''`. */
  readonly query: string;
}

/** Raw bytes no provider path may hold: controls, space, backslash, `#`, non-ASCII. */
// eslint-disable-next-line no-control-regex -- refusing control characters is the point
const RAW_FORBIDDEN = /[\x00-\x20\x7f-\uffff\\#]/;
/**
 * What no segment may decode to: a slash or backslash (an encoded separator), `%` (double
 * encoding), `;` (raw or `%3B`), controls. Java servers (Tomcat, Spring, Jetty) drop a
 * segment's `;parameters` before resolving dot segments, so `..;` would climb out of the
 * allow-list there; no provider path needs `;`, so it is refused outright.
 */
// eslint-disable-next-line no-control-regex -- refusing control characters is the point
const DECODED_FORBIDDEN = /[/\\%;\x00-\x1f\x7f]/;
/** A percent sign not followed by two hex digits. */
const BAD_ESCAPE = /%(?![0-9A-Fa-f]{2})/;

/**
 * Splits a raw request target (`req.raw.url`, before any decoding) into client, provider path
 * and query, or throws 400 `forward_path_invalid`. It refuses rather than normalises anything a
 * server on the way could read differently from the allow-list: `.` and `..` segments (also
 * percent-encoded, `%2e%2e`), encoded slashes and backslashes (`%2f`, `%5c`), double encoding
 * (`%25`), backslashes, empty segments (`//`), controls and NUL (raw or encoded), malformed
 * escapes, `;` path parameters (`..;`, `%3B`), and anything but an origin-form target
 * (`GET http://evil/...`). What passes is sent byte for byte, so the path matched is the path
 * the provider receives.
 */
export function parseForwardTarget(rawUrl: string): ForwardTarget {
  if (!rawUrl.startsWith(FORWARD_ROUTE_PREFIX)) {
    throw invalid('the request target must be a path starting with /provider/ (origin form)');
  }
  const q = rawUrl.indexOf('?');
  const pathPart = q < 0 ? rawUrl : rawUrl.slice(0, q);
  const query = q < 0 ? '' : rawUrl.slice(q);
  const rest = pathPart.slice(FORWARD_ROUTE_PREFIX.length);
  const slash = rest.indexOf('/');
  if (slash <= 0) {
    throw invalid('name the client and the provider path: /provider/<client>/api/<group>/v1/...');
  }
  const clientId = rest.slice(0, slash);
  const path = rest.slice(slash);
  assertPlainPath(path);
  if (RAW_FORBIDDEN.test(query) || BAD_ESCAPE.test(query)) {
    throw invalid(
      'the query string holds a character that must be percent-encoded (space, control, backslash, #, non-ASCII) or a malformed %-escape',
    );
  }
  return { clientId, path, query };
}

function assertPlainPath(path: string): void {
  if (RAW_FORBIDDEN.test(path)) {
    throw invalid(
      'the provider path holds a space, control character, backslash, # or non-ASCII byte; percent-encode data, never separators',
    );
  }
  if (path.includes('//')) throw invalid('the provider path holds an empty segment ("//")');
  for (const segment of path.slice(1).split('/')) {
    if (BAD_ESCAPE.test(segment)) throw invalid('the provider path holds a malformed %-escape');
    let decoded: string;
    try {
      decoded = decodeURIComponent(segment);
    } catch {
      throw invalid('the provider path holds a %-escape that is not UTF-8');
    }
    if (decoded === '.' || decoded === '..') {
      throw invalid('the provider path holds a "." or ".." segment (also when percent-encoded)');
    }
    if (DECODED_FORBIDDEN.test(decoded)) {
      throw invalid(
        'the provider path holds a ";" (raw or %3B: path parameters are refused), an encoded slash or backslash (%2F, %5C), an encoded % (double encoding) or an encoded control character',
      );
    }
  }
}

/**
 * The rule of `rules` that lets `method` and `path` (checked by {@link parseForwardTarget})
 * pass; throws 403 `forward_not_allowed` naming the client's rules otherwise. Prefixes end in
 * `/`, so `/api/marketing/v1/` never matches `/api/marketing/v1-admin/`.
 */
export function allowedBy(
  clientId: string,
  rules: readonly ForwardRule[],
  method: string,
  path: string,
): ForwardRule {
  const rule = rules.find(
    (r) => r.methods.includes(method as ForwardMethod) && path.startsWith(r.prefix),
  );
  if (rule) return rule;
  const listed =
    rules.length === 0
      ? 'no rules (nothing may be forwarded)'
      : rules.map((r) => `${r.methods.join(', ')} under ${r.prefix}`).join('; ');
  throw new ForwardException(
    ForwardErrorCode.NotAllowed,
    `${method} on this path is outside the allow-list of client "${clientId}": ${listed}. Ask the platform team to add a rule (clients[].forward.allow)`,
  );
}

function invalid(message: string): ForwardException {
  return new ForwardException(ForwardErrorCode.PathInvalid, message);
}
