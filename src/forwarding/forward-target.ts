import { describeForwardRules, type ForwardRule, ruleAllows } from '../config/client.schema';
import { ForwardErrorCode, ForwardingException } from './forwarding.exception';

export const FORWARD_ROUTE_PREFIX = '/provider/';

export interface ForwardTarget {
  /** As sent: the guard decides whether the caller may use it. */
  readonly clientId: string;
  /** Exactly as sent (percent-encoding kept), starting with `/`. */
  readonly path: string;
  /** With its `?`, exactly as sent, or `''`. */
  readonly query: string;
}

// eslint-disable-next-line no-control-regex -- refusing control characters is the point
const RAW_FORBIDDEN = /[\x00-\x20\x7f-\uffff\\#]/;
/**
 * `;` too: Java servers (Tomcat, Spring, Jetty) drop a segment's `;parameters` before resolving
 * dot segments, so `..;` would climb out of the allow-list there; no provider path needs `;`.
 */
// eslint-disable-next-line no-control-regex -- refusing control characters is the point
const DECODED_FORBIDDEN = /[/\\%;\x00-\x1f\x7f]/;
const BAD_ESCAPE = /%(?![0-9A-Fa-f]{2})/;
/** Windows and IIS trim a segment's trailing dots and spaces: `...` and `..%20` become `..`. */
const DOTS_AND_SPACES = /^[. ]+$/;
/**
 * Raw non-ASCII is refused above; decoded, it is refused whole rather than screened for the
 * look-alikes one server or another folds into `.` or `/` (Unicode NFKC, best-fit code pages):
 * that list has no end, and a provider path needs none of it.
 */
// eslint-disable-next-line no-control-regex -- the point is everything past ASCII
const NON_ASCII = /[^\x00-\x7f]/;

/**
 * Refuses rather than normalises anything a server on the way could read differently from the
 * allow-list; what passes is sent byte for byte, so the path matched is the path the provider
 * receives.
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
    if (DOTS_AND_SPACES.test(decoded)) {
      throw invalid(
        'the provider path holds a segment of only dots and spaces (".", "..", "...", "..%20"; also when percent-encoded): servers that trim trailing dots and spaces read it as ".."',
      );
    }
    if (NON_ASCII.test(decoded)) {
      throw invalid(
        'the provider path holds a percent-encoded non-ASCII character: some servers fold look-alikes (fullwidth dot U+FF0E, dot leaders U+2024 and U+2025, small full stop U+FE52, fullwidth solidus U+FF0F) into "." or "/"; provider paths are ASCII, so send such data in the query string',
      );
    }
    if (DECODED_FORBIDDEN.test(decoded)) {
      throw invalid(
        'the provider path holds a ";" (raw or %3B: path parameters are refused), an encoded slash or backslash (%2F, %5C), an encoded % (double encoding) or an encoded control character',
      );
    }
  }
}

/**
 * Prefixes end in `/`, so `/api/marketing/v1/` never matches `/api/marketing/v1-admin/`. The
 * path was checked by {@link parseForwardTarget} (plain ASCII segments), so naming it in the
 * refusal echoes nothing but what the caller asked for.
 */
export function allowedBy(
  clientId: string,
  rules: readonly ForwardRule[],
  method: string,
  path: string,
): ForwardRule {
  const rule = rules.find((r) => ruleAllows(r, method, path));
  if (rule) return rule;
  throw new ForwardingException(
    ForwardErrorCode.NotAllowed,
    `${forwardedCall(method, path)} is outside the allow-list of client "${clientId}" (${describeForwardRules(rules)}). The platform team opens it with a rule in clients[].forward.allow, e.g. ${exampleRule(method, path)}`,
  );
}

/** What a refusal names: the method and the checked path, capped. */
export function forwardedCall(method: string, path: string): string {
  return `${method} ${path.length > 200 ? `${path.slice(0, 200)}...` : path}`;
}

/** The narrowest prefix rule that would let the call pass: its parent folder. */
export function exampleRule(method: string, path: string): string {
  const prefix = path.slice(0, path.lastIndexOf('/') + 1);
  return JSON.stringify({ methods: [method], prefix: prefix.length > 200 ? '/...' : prefix });
}

function invalid(message: string): ForwardingException {
  return new ForwardingException(ForwardErrorCode.PathInvalid, message);
}
