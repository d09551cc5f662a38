import { hash, timingSafeEqual } from 'node:crypto';
import type { ApiKeyGrant } from '../config/caller-auth.schema';
import { ConfigErrorCode, ConfigException } from '../config/config.exception';
import { bearerCredential, MAX_CREDENTIAL_LENGTH, unauthenticated } from './bearer-credential';
import type { Caller, CallerAuthenticator, CallerReload } from './caller';
import { grantedCaller } from './caller-authorization';

interface Entry {
  readonly digest: Buffer;
  readonly caller: Caller;
}

/**
 * The first 6 bytes of a latin1 digest as a number: spares the hot path a hex string and its
 * hashing by the Map; digests sharing them (never, in practice) are each compared in full.
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

/**
 * Only SHA-256 hashes are held, so a leaked config leaks no usable key; keys are random and long,
 * so an unsalted fast hash is enough.
 */
export class ApiKeyAuthenticator implements CallerAuthenticator {
  /** By the hex SHA-256 (the configured form). */
  private byHash: ReadonlyMap<string, Entry> = new Map();
  private byBucket: ReadonlyMap<number, readonly Entry[]> = new Map();
  private reloadTimer?: NodeJS.Timeout;
  private readonly scratch = Buffer.alloc(32);

  /** @param load the key source to re-read (absent: inline keys only, nothing to re-read). */
  constructor(
    grants: readonly ApiKeyGrant[],
    private readonly load?: () => Promise<readonly ApiKeyGrant[]>,
  ) {
    this.replace(grants);
  }

  get size(): number {
    return this.byHash.size;
  }

  /**
   * Synchronous (the hot path). Lookup timing depends only on the hash of what was sent, which
   * tells an attacker nothing; the decision rests on `timingSafeEqual`.
   */
  authenticate(authorization: string | undefined): Caller {
    // A hash match proves the key whatever its characters: the strict parse only explains refusals.
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

  /** All at once: a request sees the old set or the new, never a mix. Throws on a duplicate key. */
  replace(grants: readonly ApiKeyGrant[]): CallerReload {
    const next = new Map<string, Entry>();
    const buckets = new Map<number, Entry[]>();
    for (const g of grants) {
      if (next.has(g.sha256)) {
        throw ConfigException.of(ConfigErrorCode.Invalid, [
          `callerAuth: the API key of caller "${g.name}" is listed twice (in callerAuth.apiKeys and the key secret, or twice in one); list each key once`,
        ]);
      }
      const entry = { digest: Buffer.from(g.sha256, 'hex'), caller: grantedCaller(g.name, g) };
      next.set(g.sha256, entry);
      const bucket = bucketOf(entry.digest.toString('latin1'));
      buckets.set(bucket, [...(buckets.get(bucket) ?? []), entry]);
    }
    const previous = this.byHash;
    this.byHash = next;
    this.byBucket = buckets;
    const names = (m: ReadonlyMap<string, Entry>, other: ReadonlyMap<string, Entry>) => [
      ...new Set([...m].filter(([h]) => !other.has(h)).map(([, e]) => e.caller.name)),
    ];
    return { added: names(next, previous), removed: names(previous, next) };
  }

  /** A failed read keeps the current keys: a Secrets Manager hiccup must not lock callers out. */
  reloadEvery(
    everyMs: number,
    report: (result: { changed: CallerReload } | { error: unknown }) => void,
  ): void {
    clearInterval(this.reloadTimer);
    this.reloadTimer = setInterval(() => {
      this.reloadNow()
        .then((changed) => {
          if (changed.added.length + changed.removed.length > 0) report({ changed });
        })
        .catch((error: unknown) => report({ error }));
    }, everyMs);
    this.reloadTimer.unref();
  }

  close(): void {
    clearInterval(this.reloadTimer);
  }

  /** The admin reload: the same source as the timer. Throws, keeping the current keys, on failure. */
  async reloadNow(): Promise<CallerReload> {
    if (this.load === undefined) return { added: [], removed: [] };
    return this.replace(await this.load());
  }

  private lookup(key: string): Caller | undefined {
    if (key.length > MAX_CREDENTIAL_LENGTH) return undefined;
    // latin1, not a Buffer: a Buffer result allocates an ArrayBuffer per call.
    const digest = hash('sha256', key, 'binary');
    const bucket = this.byBucket.get(bucketOf(digest));
    if (bucket === undefined) return undefined;
    this.scratch.write(digest, 0, 'latin1');
    let found: Caller | undefined;
    for (const entry of bucket) {
      if (timingSafeEqual(entry.digest, this.scratch)) found = entry.caller;
    }
    return found;
  }
}
