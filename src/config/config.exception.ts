/** Why the configuration was refused. */
export enum ConfigErrorCode {
  Invalid = 'config_invalid',
  FileUnreadable = 'config_file_unreadable',
  FileUnparsable = 'config_file_unparsable',
}

/**
 * A configuration problem found at start-up. The message names each setting at fault and
 * what it must be, never the value it had: a value may be a secret pasted in the wrong place.
 */
export class ConfigException extends Error {
  constructor(
    readonly code: ConfigErrorCode,
    /** One line per problem, `SETTING: what is wrong`. */
    readonly problems: string[],
    options?: { cause?: unknown },
  ) {
    super(`Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`, options);
    this.name = 'ConfigException';
  }
}
