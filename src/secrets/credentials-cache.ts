import { type ClientCredentials, sameCredentials } from './client-credentials';
import { SecretsException } from './secrets.exception';

/** A rotation leaves the new secret `AWSPENDING` until promoted, then the old one `AWSPREVIOUS`. */
export const SECRETS_MANAGER_ROTATION_STAGES: readonly string[] = ['AWSPENDING', 'AWSPREVIOUS'];

/** Re-read at most every `maxAgeMs` (a rotation is picked up without a restart) and on refusal. */
export class CredentialsCache {
  private credentials?: ClientCredentials;
  private loadedAt = 0;

  /**
   * @param load with a `stage`, that Secrets Manager staging label instead of the current version.
   * @param rotationStages tried after the current version when the server refuses the
   *   credentials: none for a file, which has one version.
   */
  constructor(
    private readonly load: (stage?: string) => Promise<ClientCredentials>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
    private readonly rotationStages: readonly string[] = [],
  ) {}

  /** Through a transient source failure (a Secrets Manager blip) the last good ones are kept. */
  async get(force = false): Promise<ClientCredentials> {
    if (!force && this.credentials && this.now() - this.loadedAt < this.maxAgeMs) {
      return this.credentials;
    }
    try {
      this.credentials = await this.load();
      this.loadedAt = this.now();
    } catch (err) {
      if (!(this.credentials && err instanceof SecretsException && err.transient)) throw err;
    }
    return this.credentials;
  }

  /**
   * `first` when nothing was loaded (a replica that only adopted the fleet's tokens never needed
   * them). Throws, keeping the current ones, when the source cannot be read.
   */
  async reload(): Promise<'changed' | 'unchanged' | 'first'> {
    const before = this.credentials;
    this.credentials = await this.load();
    this.loadedAt = this.now();
    if (before === undefined) return 'first';
    return sameCredentials(before, this.credentials) ? 'unchanged' : 'changed';
  }

  /**
   * After the server refused `refused`: tries the current version, then each rotation stage,
   * with each version not tried yet, until one is not refused. `undefined` when no version
   * differs (an operator must act); throws the last refusal when every one was refused.
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
        // A missing staging label (no rotation in progress) is no candidate.
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
