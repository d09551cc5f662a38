import { readFile, stat } from 'node:fs/promises';

/** Where the caller's credential comes from. */
export type CredentialSource =
  | { apiKey: string }
  | {
      /** A projected service-account token (mode `kubernetes`), which the kubelet rotates. */
      serviceAccountTokenFile: string;
      /**
       * Re-read at least this often even when the file looks unchanged.
       * @default 60_000
       */
      reloadMs?: number;
    };

/**
 * The bearer credential to send. An API key is fixed. A service-account token file is
 * re-read when its modification time or size changes (the kubelet swaps the `..data` symlink
 * atomically, which `stat` follows), at least every `reloadMs`, and on demand after a 401.
 */
export class Credential {
  private cached?: { value: string; mtimeMs: number; size: number; readAt: number };

  constructor(
    private readonly source: CredentialSource,
    private readonly now: () => number = Date.now,
  ) {
    if ('apiKey' in source) {
      if (typeof source.apiKey !== 'string' || source.apiKey.trim() === '') {
        throw new TypeError('apiKey must be a non-empty string');
      }
    } else if (
      typeof source.serviceAccountTokenFile !== 'string' ||
      source.serviceAccountTokenFile === ''
    ) {
      throw new TypeError('serviceAccountTokenFile must be a file path');
    }
  }

  /** The current credential. `fresh` forces a re-read of the token file. */
  async value(fresh = false): Promise<string> {
    if ('apiKey' in this.source) return this.source.apiKey.trim();
    const file = this.source.serviceAccountTokenFile;
    const reloadMs = this.source.reloadMs ?? 60_000;
    const info = await stat(file).catch((err: unknown) => {
      throw new TypeError(`cannot read serviceAccountTokenFile ${file}: ${describe(err)}`);
    });
    const c = this.cached;
    if (
      !fresh &&
      c &&
      c.mtimeMs === info.mtimeMs &&
      c.size === info.size &&
      this.now() - c.readAt < reloadMs
    ) {
      return c.value;
    }
    const value = (await readFile(file, 'utf8')).trim();
    if (value === '') throw new TypeError(`serviceAccountTokenFile ${file} is empty`);
    this.cached = { value, mtimeMs: info.mtimeMs, size: info.size, readAt: this.now() };
    return value;
  }

  /** Whether a 401 may be cured by reading the credential again. */
  get rotates(): boolean {
    return !('apiKey' in this.source);
  }
}

function describe(err: unknown): string {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' ? code : 'unreadable';
}
