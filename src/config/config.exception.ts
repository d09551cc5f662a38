import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

/** Why the configuration was refused. */
export enum ConfigErrorCode {
  Invalid = 'config_invalid',
  FileUnreadable = 'config_file_unreadable',
  FileUnparsable = 'config_file_unparsable',
}

export interface ConfigExceptionOptions extends BrokerExceptionOptions {
  /** The problems, one line each; the message alone when not given. */
  problems?: string[];
}

/**
 * A configuration problem found at start-up. The message names each setting at fault and
 * what it must be, never the value it had: a value may be a secret pasted in the wrong place.
 */
export class ConfigException extends BrokerException<ConfigErrorCode> {
  /** One line per problem, `SETTING: what is wrong`. */
  readonly problems: string[];

  constructor(code: ConfigErrorCode, message: string, options: ConfigExceptionOptions = {}) {
    super(code, message, options);
    this.problems = options.problems ?? [message];
  }

  /** One exception listing every problem found, one line each, in its message. */
  static of(
    code: ConfigErrorCode,
    problems: string[],
    options: BrokerExceptionOptions = {},
  ): ConfigException {
    const message = `Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`;
    return new ConfigException(code, message, { ...options, problems });
  }
}
