import type { FastifyBaseLogger } from 'fastify';
import type { Bindings, ChildLoggerOptions, LogFn } from 'pino';

/**
 * Fastify's per-request child logger with redaction costs more than the whole `GET /token` hot
 * path, and almost no request logs: the real child is created on first use.
 */
class LazyChildLogger {
  private created?: FastifyBaseLogger;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly bindings: Bindings,
    private readonly options: ChildLoggerOptions,
  ) {}

  private real(): FastifyBaseLogger {
    return (this.created ??= this.parent.child(this.bindings, this.options));
  }

  get level(): string {
    return (this.created ?? this.parent).level;
  }
  set level(value: string) {
    this.real().level = value;
  }
  fatal(...args: Parameters<LogFn>): void {
    this.real().fatal(...args);
  }
  error(...args: Parameters<LogFn>): void {
    this.real().error(...args);
  }
  warn(...args: Parameters<LogFn>): void {
    this.real().warn(...args);
  }
  info(...args: Parameters<LogFn>): void {
    this.real().info(...args);
  }
  debug(...args: Parameters<LogFn>): void {
    this.real().debug(...args);
  }
  trace(...args: Parameters<LogFn>): void {
    this.real().trace(...args);
  }
  silent(...args: Parameters<LogFn>): void {
    this.real().silent(...args);
  }
  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.real().child(bindings, options);
  }
}

export function lazyChildLogger(
  logger: FastifyBaseLogger,
  bindings: Bindings,
  options: ChildLoggerOptions,
): FastifyBaseLogger {
  return new LazyChildLogger(logger, bindings, options);
}
