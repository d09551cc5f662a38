import { type ClientCredentials, sameCredentials } from './client-credentials';
import { SecretsException } from './secrets.exception';

/** A rotation leaves the new secret `AWSPENDING` until promoted, then the old one `AWSPREVIOUS`. */
export const SECRETS_MANAGER_ROTATION_STAGES: readonly string[] = ['AWSPENDING', 'AWSPREVIOUS'];

/** Re-read at most every `maxAgeMs` (a rotation is picked up without a restart) and on refusal. */
export class CredentialsCache {
  private credentials?: ClientCredentials;
  private loadedAt = 0;
  /** The stage the server accepted when it refused `refusedCurrent`, the current version. */
  private pinned?: { stage: string; refusedCurrent: ClientCredentials };

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
      this.credentials = await this.loadPreferred();
      this.loadedAt = this.now();
    } catch (err) {
      if (!(this.credentials && err instanceof SecretsException && err.transient)) throw err;
    }
    return this.credentials;
  }

  /**
   * The current version, or, while the current version is still the one the server refused,
   * the rotation stage it accepted instead: a re-read during a half-finished rotation does not
   * go back to what was refused (and cost one more refused request each time).
   */
  private async loadPreferred(): Promise<ClientCredentials> {
    const current = await this.load();
    const pin = this.pinned;
    if (pin === undefined) return current;
    if (!sameCredentials(current, pin.refusedCurrent)) {
      // The rotation moved on (AWSCURRENT promoted or replaced): back to the current version.
      this.pinned = undefined;
      return current;
    }
    try {
      return await this.load(pin.stage);
    } catch (err) {
      if (err instanceof SecretsException && err.transient) throw err;
      // The label is gone (the rotation was cancelled): the current version again.
      this.pinned = undefined;
      return current;
    }
  }

  /**
   * `first` when nothing was loaded (a replica that only adopted the fleet's tokens never needed
   * them). Throws, keeping the current ones, when the source cannot be read.
   */
  async reload(): Promise<'changed' | 'unchanged' | 'first'> {
    const before = this.credentials;
    this.credentials = await this.loadPreferred();
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
    // The current version as read now: a stage accepted instead is kept while it stays so.
    let current: ClientCredentials | undefined;
    for (const stage of [undefined, ...this.rotationStages]) {
      let candidate: ClientCredentials;
      try {
        candidate = stage === undefined ? await this.loadCurrent() : await this.load(stage);
      } catch (err) {
        // A missing staging label (no rotation in progress) is no candidate.
        if (stage !== undefined && err instanceof SecretsException) continue;
        throw err;
      }
      if (stage === undefined) current = candidate;
      if (tried.some((t) => sameCredentials(t, candidate))) continue;
      tried.push(candidate);
      try {
        const result = await attempt(candidate);
        this.credentials = candidate;
        this.loadedAt = this.now();
        this.pinned =
          stage !== undefined && current !== undefined
            ? { stage, refusedCurrent: current }
            : undefined;
        return { result, ...(stage !== undefined && { stage }) };
      } catch (err) {
        if (!isRefusal(err)) throw err;
        lastRefusal = err;
      }
    }
    if (lastRefusal !== undefined) throw lastRefusal;
    return undefined;
  }

  /** The current version; through a transient source failure, the last good ones. */
  private async loadCurrent(): Promise<ClientCredentials> {
    try {
      this.credentials = await this.load();
      this.loadedAt = this.now();
    } catch (err) {
      if (!(this.credentials && err instanceof SecretsException && err.transient)) throw err;
    }
    return this.credentials;
  }
}
