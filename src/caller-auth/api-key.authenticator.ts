import { hash, timingSafeEqual } from 'node:crypto';
import type { ApiKeyGrant } from '../config/caller-auth.schema';
import { ConfigErrorCode, ConfigException } from '../config/config.exception';
import { bearerCredential, MAX_CREDENTIAL_LENGTH, unauthenticated } from './bearer-credential';
import type { Caller, CallerAuthenticator } from './caller';
import { grantedCaller } from './caller-authorization';

interface Entry {
  /** The key's SHA-256, for the constant-time comparison. */
  readonly digest: Buffer;
  readonly caller: Caller;
}

/**
 * The index of a SHA-256 digest held as a latin1 string (one character per byte, as `hash(...,
 * 'binary')` returns it): its first 6 bytes as a number. A number key spares the hot path the hex
 * string of the digest and the hashing of that string by the Map; entries whose digests share
 * these bytes (never, in practice) share a bucket and are each compared in full.
 */
function bucketOf(digest: string): number {
  return (
    digest.charCodeAt(0) +
    digest.charCodeAt(1) * 0x100 +
    digest.charCodeAt(2) * 0x10000 +
    digest.charCodeAt(3) * 0x1000000 +
    digest.charCodeAt(4) * 0x100000000 +
    digest.charCodeAt(5) * 0x10000000000
  );
}

/** What a reload changed, by caller name (names are safe to log; keys and hashes are not logged). */
export interface ApiKeyReload {
  added: string[];
  removed: string[];
}

/**
 * Caller authentication mode `api-key`. The broker holds only SHA-256 hashes of the keys, so
 * a leaked config or secret does not leak a usable key; keys are random and long, so an
 * unsalted fast hash is enough (nobody can brute-force 256 random bits).
 */
export class ApiKeyAuthenticator implements CallerAuthenticator {
  /** Every accepted key by its hex SHA-256 (the configured form). */
  private byHash: ReadonlyMap<string, Entry> = new Map();
  /** The same entries by {@link bucketOf} their digest, for the hot path. */
  private byBucket: ReadonlyMap<number, readonly Entry[]> = new Map();
  private reloadTimer?: NodeJS.Timeout;
  /** The presented key's digest, for the constant-time comparison (see {@link lookup}). */
  private readonly scratch = Buffer.alloc(32);
  private load?: () => Promise<readonly ApiKeyGrant[]>;

  constructor(grants: readonly ApiKeyGrant[]) {
    this.replace(grants);
  }

  /** Number of keys currently accepted. */
  get size(): number {
    return this.byHash.size;
  }

  /**
   * Synchronous on purpose (the hot path): one SHA-256 of the presented key, one Map lookup,
   * one constant-time compare. The lookup's timing depends only on the hash of what the caller
   * sent, which tells an attacker nothing about a stored key; the explicit `timingSafeEqual`
   * keeps the decision itself from resting on a variable-time comparison.
   */
  authenticate(authorization: string | undefined): Caller {
    // Fast path for the exact form every client sends: a hash match proves the key whatever
    // its characters, so the strict parse (a regex) is only needed to explain a refusal.
    if (authorization?.startsWith('Bearer ')) {
      const caller = this.lookup(authorization.slice(7));
      if (caller !== undefined) return caller;
    }
    const caller = this.lookup(bearerCredential(authorization));
    if (caller === undefined) {
      throw unauthenticated('unknown API key; check the key, or ask the platform team for one');
    }
    return caller;
  }

  /**
   * Swaps the whole set of accepted keys at once: a request sees the old set or the new one,
   * never a mix. Throws (keeping the current set) when a key is listed twice.
   */
  replace(grants: readonly ApiKeyGrant[]): ApiKeyReload {
    const next = new Map<string, Entry>();
    for (const g of grants) {
      if (next.has(g.sha256)) {
        throw ConfigException.of(ConfigErrorCode.Invalid, [
          `callerAuth: the API key of caller "${g.name}" is listed twice (in callerAuth.apiKeys and the key secret, or twice in one); list each key once`,
        ]);
      }
      next.set(g.sha256, {
        digest: Buffer.from(g.sha256, 'hex'),
        caller: grantedCaller(g.name, g),
      });
    }
    const buckets = new Map<number, Entry[]>();
    for (const entry of next.values()) {
      const bucket = bucketOf(entry.digest.toString('latin1'));
      buckets.set(bucket, [...(buckets.get(bucket) ?? []), entry]);
    }
    const previous = this.byHash;
    // One assignment each, in the same synchronous step: no request sees a mix.
    this.byHash = next;
    this.byBucket = buckets;
    const names = (m: ReadonlyMap<string, Entry>, other: ReadonlyMap<string, Entry>) => [
      ...new Set([...m].filter(([h]) => !other.has(h)).map(([, e]) => e.caller.name)),
    ];
    return { added: names(next, previous), removed: names(previous, next) };
  }

  /**
   * Re-reads the grants every `everyMs`, so granting or revoking a key needs no restart. A
   * failed read keeps the current keys: a Secrets Manager hiccup must not lock callers out.
   */
  reloadEvery(
    everyMs: number,
    load: () => Promise<readonly ApiKeyGrant[]>,
    report: (result: { changed: ApiKeyReload } | { error: unknown }) => void,
  ): void {
    this.readFrom(load);
    clearInterval(this.reloadTimer);
    this.reloadTimer = setInterval(() => {
      load()
        .then((grants) => {
          const changed = this.replace(grants);
          if (changed.added.length + changed.removed.length > 0) report({ changed });
        })
        .catch((error: unknown) => report({ error }));
    }, everyMs);
    this.reloadTimer.unref();
  }

  close(): void {
    clearInterval(this.reloadTimer);
  }

  /** Where {@link reloadNow} re-reads the grants (the same source as the periodic reload). */
  readFrom(load: () => Promise<readonly ApiKeyGrant[]>): void {
    this.load = load;
  }

  /** Re-reads the grants now (see {@link readFrom}); throws, keeping the current keys, on failure. */
  async reloadNow(): Promise<ApiKeyReload> {
    if (this.load === undefined) return { added: [], removed: [] };
    return this.replace(await this.load());
  }

  private lookup(key: string): Caller | undefined {
    if (key.length > MAX_CREDENTIAL_LENGTH) return undefined;
    // The digest as a latin1 ("binary") string rather than a Buffer: a Buffer result allocates
    // a new ArrayBuffer per call, which costs twice as much on the hot path.
    const digest = hash('sha256', key, 'binary');
    const bucket = this.byBucket.get(bucketOf(digest));
    if (bucket === undefined) return undefined;
    // The decision rests on a constant-time comparison of the whole digest; which bucket is
    // looked at depends only on the hash of what the caller sent. The scratch buffer is
    // written and read in this synchronous step only.
    this.scratch.write(digest, 0, 'latin1');
    let found: Caller | undefined;
    for (const entry of bucket) {
      if (timingSafeEqual(entry.digest, this.scratch)) found = entry.caller;
    }
    return found;
  }
}
