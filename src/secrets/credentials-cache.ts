import { type ClientCredentials, sameCredentials } from './client-credentials';
import { SecretsException } from './secrets.exception';

/**
 * Where a Secrets Manager rotation leaves the other versions: the new secret is `AWSPENDING`
 * until it is promoted, then the old one is `AWSPREVIOUS`.
 */
export const SECRETS_MANAGER_ROTATION_STAGES: readonly string[] = ['AWSPENDING', 'AWSPREVIOUS'];

/**
 * One client's credentials, read from their source at most every `maxAgeMs` (so a rotation is
 * picked up without a restart) and on demand after the provider refused them.
 */
export class CredentialsCache {
  private credentials?: ClientCredentials;
  private loadedAt = 0;

  /**
   * @param load reads the credentials from their source (Secrets Manager or a file); with a
   *   `stage`, that Secrets Manager staging label instead of the current version.
   * @param maxAgeMs re-read after this long even without a failure.
   * @param now the clock (epoch ms).
   * @param rotationStages the staging labels tried after the current version when the server
   *   refuses the credentials (see {@link rotate}): none for a file, which has one version.
   */
  constructor(
    private readonly load: (stage?: string) => Promise<ClientCredentials>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
    private readonly rotationStages: readonly string[] = [],
  ) {}

  /**
   * The cached credentials, re-read when older than `maxAgeMs` or when `force`d. Through a
   * transient source failure (a Secrets Manager blip) the last good credentials are kept;
   * anything else throws {@link SecretsException}.
   */
  async get(force = false): Promise<ClientCredentials> {
    if (!force && this.credentials && this.now() - this.loadedAt < this.maxAgeMs) {
      return this.credentials;
    }
    try {
      this.credentials = await this.load();
      this.loadedAt = this.now();
    } catch (err) {
      if (this.credentials && err instanceof SecretsException && err.transient)
        return this.credentials;
      throw err;
    }
    return this.credentials;
  }

  /**
   * Re-reads the source now (an operator's reload): `changed` or `unchanged` against what was
   * loaded, `first` when nothing was (a replica that only ever adopted the fleet's tokens never
   * needed them). Throws, keeping the current ones, when the source cannot be read.
   */
  async reload(): Promise<'changed' | 'unchanged' | 'first'> {
    const before = this.credentials;
    this.credentials = await this.load();
    this.loadedAt = this.now();
    if (before === undefined) return 'first';
    return sameCredentials(before, this.credentials) ? 'unchanged' : 'changed';
  }

  /**
   * Rotation without a failed refresh: after the server refused `refused`, re-reads the current
   * version, then each of {@link rotationStages} (Secrets Manager: `AWSPENDING`, then
   * `AWSPREVIOUS`), and calls `attempt` with each one that differs from everything tried so
   * far, until one is not refused (`isRefusal`). Those credentials are kept, and the stage they
   * came from (`undefined`: the current version) is returned with `attempt`'s result. Returns
   * `undefined` when no version differs from the refused credentials (an operator must act);
   * throws the last refusal when every different version was refused too.
   */
  async rotate<T>(
    refused: ClientCredentials,
    attempt: (credentials: ClientCredentials) => Promise<T>,
    isRefusal: (err: unknown) => err is Error,
  ): Promise<{ result: T; stage?: string } | undefined> {
    const tried: ClientCredentials[] = [refused];
    let lastRefusal: Error | undefined;
    for (const stage of [undefined, ...this.rotationStages]) {
      let candidate: ClientCredentials;
      try {
        candidate = stage === undefined ? await this.get(true) : await this.load(stage);
      } catch (err) {
        // A staging label that does not exist (no rotation in progress) or cannot be read
        // now is no candidate; the current version's failures are the source's failures.
        if (stage !== undefined && err instanceof SecretsException) continue;
        throw err;
      }
      if (tried.some((t) => sameCredentials(t, candidate))) continue;
      tried.push(candidate);
      try {
        const result = await attempt(candidate);
        this.credentials = candidate;
        this.loadedAt = this.now();
        return { result, ...(stage !== undefined && { stage }) };
      } catch (err) {
        if (!isRefusal(err)) throw err;
        lastRefusal = err;
      }
    }
    if (lastRefusal !== undefined) throw lastRefusal;
    return undefined;
  }
}
