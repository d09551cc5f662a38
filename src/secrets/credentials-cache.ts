import { type ClientCredentials, sameCredentials } from './client-credentials';
import { SecretsException } from './secrets.exception';

/**
 * One client's credentials, read from their source at most every `maxAgeMs` (so a rotation is
 * picked up without a restart) and on demand after the provider refused them.
 */
export class CredentialsCache {
  private credentials?: ClientCredentials;
  private loadedAt = 0;

  /**
   * @param load reads the credentials from their source (Secrets Manager or a file).
   * @param maxAgeMs re-read after this long even without a failure.
   * @param now the clock (epoch ms).
   */
  constructor(
    private readonly load: () => Promise<ClientCredentials>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
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
   * Rotation: after the provider refused `refused`, re-reads the source once. Returns the new
   * credentials if they differ, or `undefined` when the source still holds the refused ones
   * (then retrying is pointless: an operator must act).
   */
  async rotated(refused: ClientCredentials): Promise<ClientCredentials | undefined> {
    const fresh = await this.get(true);
    return sameCredentials(fresh, refused) ? undefined : fresh;
  }
}
