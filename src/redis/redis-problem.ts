/**
 * Telling a Redis *configuration* error (wrong or missing password, an ACL that forbids what
 * the broker needs, a certificate the broker does not trust) from an *outage* (refused, reset,
 * timed out). An outage passes by itself, and the broker serves from memory meanwhile; a
 * configuration error never passes until someone fixes a setting, so it must fail readiness and
 * say which setting.
 *
 * Only messages written here or by the Redis server and Node's TLS stack are used: neither
 * contains a password.
 */

/** What kind of configuration error Redis (or the TLS handshake) reported. */
export type RedisProblemKind = 'authentication' | 'permission' | 'tls';

/** A configuration error, with a message that names its cause and the settings to check. */
export interface RedisProblem {
  readonly kind: RedisProblemKind;
  readonly message: string;
}

/** Node/OpenSSL certificate errors: the server's certificate is not one the broker trusts. */
const TLS_CERT_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

const TLS_HINT =
  'check REDIS_TLS_CA_FILE (the CA that signed the server certificate) and REDIS_TLS_SERVER_NAME (the name the certificate carries)';

/**
 * The configuration error behind `err`, or `undefined` for anything else (an outage, a
 * timeout, a script error). Looks through ioredis's wrappers (`Ready check failed: ...`, a
 * cluster's `lastNodeError`).
 */
export function classifyRedisError(err: unknown): RedisProblem | undefined {
  for (const e of causes(err)) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== undefined && TLS_CERT_CODES.has(code)) {
      return {
        kind: 'tls',
        message: `the Redis server's TLS certificate is not trusted (${code}: ${e.message}); ${TLS_HINT}`,
      };
    }
    if (code === 'ERR_SSL_WRONG_VERSION_NUMBER' || /wrong version number/i.test(e.message)) {
      return tlsMismatch(true);
    }
    const found = explained.get(e);
    if (found !== undefined) return found;
    const reply = replyText(e.message);
    if (reply.startsWith('WRONGPASS')) {
      return {
        kind: 'authentication',
        message: `Redis refused the credentials (${firstLine(reply)}); check REDIS_USERNAME and the password in REDIS_PASSWORD_FILE / REDIS_PASSWORD_SECRET_ID`,
      };
    }
    if (reply.startsWith('NOAUTH')) {
      return {
        kind: 'authentication',
        message:
          'Redis requires a password and none is configured (NOAUTH); set REDIS_PASSWORD_FILE or REDIS_PASSWORD_SECRET_ID (and REDIS_USERNAME for an ACL user)',
      };
    }
    if (reply.startsWith('NOPERM')) {
      return {
        kind: 'permission',
        message: `the Redis ACL user lacks a permission the broker needs (${firstLine(reply)}); grant it "~tb:* &tb:* +@read +@write +@scripting +@pubsub +ping +info" or check REDIS_USERNAME`,
      };
    }
  }
  return undefined;
}

/**
 * Errors whose cause was found out afterwards (a reset connection that a probe showed to be a
 * TLS mismatch): their own message only says "reset".
 */
const explained = new WeakMap<Error, RedisProblem>();

/** Records that `err` was caused by `problem`, for {@link classifyRedisError}. */
export function explainRedisError(err: Error, problem: RedisProblem): void {
  explained.set(err, problem);
}

/**
 * The broker and the Redis port disagree about TLS. Either way the server just drops the
 * connection, which looks like an outage, so the message names both settings that choose TLS.
 * @param brokerUsesTls whether the broker spoke TLS (a `rediss://` URL or `REDIS_TLS=true`).
 */
export function tlsMismatch(brokerUsesTls: boolean): RedisProblem {
  return {
    kind: 'tls',
    message: brokerUsesTls
      ? 'the Redis port does not speak TLS but the broker connects with TLS (a rediss:// REDIS_URL or REDIS_TLS=true); use a redis:// URL with REDIS_TLS off, or the TLS port'
      : 'the Redis port speaks TLS only but the broker connects in clear (a redis:// REDIS_URL and REDIS_TLS off); use a rediss:// URL or set REDIS_TLS=true',
  };
}

/** `err`, its `cause` chain and a cluster's `lastNodeError`, each once. */
function causes(err: unknown): Error[] {
  const found: Error[] = [];
  let next: unknown = err;
  while (next instanceof Error && !found.includes(next) && found.length < 5) {
    found.push(next);
    next = (next as { lastNodeError?: unknown }).lastNodeError ?? next.cause;
  }
  return found;
}

/** The Redis error reply inside an ioredis message (`Ready check failed: NOAUTH ...`). */
function replyText(message: string): string {
  return message.replace(/^Ready check failed: /, '');
}

function firstLine(text: string): string {
  return text.split('\n')[0].slice(0, 200);
}
