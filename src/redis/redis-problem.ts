/**
 * A *configuration* error (password, ACL, an untrusted certificate, a host that never resolved)
 * never passes until a setting is fixed, so it fails readiness and names the setting; an *outage*
 * passes by itself. Messages come only from here, the Redis server and Node's TLS and DNS errors
 * (which name the host, never the URL): none contains a password.
 */

type RedisProblemKind = 'authentication' | 'permission' | 'tls' | 'address';

/** A message that names the cause and the settings to check. */
export interface RedisProblem {
  readonly kind: RedisProblemKind;
  readonly message: string;
}

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

/** `undefined` for an outage, a timeout or a script error; looks through ioredis's wrappers. */
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
    // `Ready check failed: NOAUTH ...`.
    const reply = e.message.replace(/^Ready check failed: /, '');
    if (reply.startsWith('WRONGPASS')) {
      return wrongCredentials(
        reply,
        'REDIS_USERNAME and the password in REDIS_PASSWORD_FILE / REDIS_PASSWORD_SECRET_ID',
      );
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

function wrongCredentials(reply: string, check: string): RedisProblem {
  return {
    kind: 'authentication',
    message: `Redis refused the credentials (${firstLine(reply)}); check ${check}`,
  };
}

/**
 * A WRONGPASS names where the credentials the broker sent came from (`credentialsFrom`, e.g.
 * "the user and password in REDIS_URL"), so the check points at the one setting that is used.
 */
export function explainWrongCredentials(err: unknown, credentialsFrom: string): void {
  for (const e of causes(err)) {
    const reply = e.message.replace(/^Ready check failed: /, '');
    if (reply.startsWith('WRONGPASS')) {
      explained.set(e, wrongCredentials(reply, credentialsFrom));
      return;
    }
  }
}

/**
 * A host that does not resolve before Redis was ever reached is a typo or a wrong name, not an
 * outage (ENOTFOUND is a definite "no such name"; EAI_AGAIN, a DNS server failing, stays one).
 * @param setting where the host is written: REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES.
 */
export function unresolvedHost(err: unknown, setting: string): RedisProblem | undefined {
  for (const e of causes(err)) {
    if ((e as NodeJS.ErrnoException).code === 'ENOTFOUND') {
      return {
        kind: 'address',
        message: `the Redis host does not resolve (${firstLine(e)}); check the host in ${setting}`,
      };
    }
  }
  return undefined;
}

/** Causes found out afterwards (a reset a probe showed to be a TLS mismatch). */
const explained = new WeakMap<Error, RedisProblem>();

export function explainRedisError(err: Error, problem: RedisProblem): void {
  explained.set(err, problem);
}

/**
 * Either way the server just drops the connection, which looks like an outage.
 * @param brokerUsesTls a `rediss://` URL or `REDIS_TLS=true`.
 */
export function tlsMismatch(brokerUsesTls: boolean): RedisProblem {
  return {
    kind: 'tls',
    message: brokerUsesTls
      ? 'the Redis port does not speak TLS but the broker connects with TLS (a rediss:// REDIS_URL or REDIS_TLS=true); use a redis:// URL with REDIS_TLS off, or the TLS port'
      : 'the Redis port speaks TLS only but the broker connects in clear (a redis:// REDIS_URL and REDIS_TLS off); use a rediss:// URL or set REDIS_TLS=true',
  };
}

/**
 * What a TLS mismatch looks like from the client: a TLS server drops a clear client, a plain
 * server waits on a handshake until timeout.
 */
export function isDroppedConnection(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === 'ECONNRESET' || code === 'EPIPE' || code === 'ETIMEDOUT';
}

function causes(err: unknown): Error[] {
  const found: Error[] = [];
  let next: unknown = err;
  while (next instanceof Error && !found.includes(next) && found.length < 5) {
    found.push(next);
    next = (next as { lastNodeError?: unknown }).lastNodeError ?? next.cause;
  }
  return found;
}

/** An error's message (or any text), first line only and capped: a reply may run on for pages. */
export function firstLine(cause: unknown): string {
  const text = cause instanceof Error ? cause.message : String(cause);
  return text.split('\n')[0].slice(0, 200);
}
