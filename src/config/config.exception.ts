import { BrokerException, type BrokerExceptionOptions } from '../errors/broker.exception';

export enum ConfigErrorCode {
  Invalid = 'config_invalid',
  FileUnreadable = 'config_file_unreadable',
  FileUnparsable = 'config_file_unparsable',
}

interface ConfigExceptionOptions extends BrokerExceptionOptions {
  problems?: string[];
}

/** Names each setting at fault, never its value: it may be a secret pasted in the wrong place. */
export class ConfigException extends BrokerException<ConfigErrorCode> {
  readonly problems: string[];

  constructor(code: ConfigErrorCode, message: string, options: ConfigExceptionOptions = {}) {
    super(code, message, options);
    this.problems = options.problems ?? [message];
  }

  static of(
    code: ConfigErrorCode,
    problems: string[],
    options: BrokerExceptionOptions = {},
  ): ConfigException {
    const message = `Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`;
    return new ConfigException(code, message, { ...options, problems });
  }
}
