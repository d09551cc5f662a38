import { type LoggerService } from '@nestjs/common';
import pino, { type DestinationStream, type Logger } from 'pino';

/** Injection token for the root pino logger. */
export const LOGGER = 'TOKEN_BROKER:LOGGER';

/**
 * Paths redacted wherever they appear in a log object. Tokens and secrets are never logged on
 * purpose; this is the net for the day someone logs a whole request, header set or error.
 */
export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-api-key"]',
  'headers.authorization',
  'headers.cookie',
  'authorization',
  'accessToken',
  'access_token',
  'token',
  'clientSecret',
  'client_secret',
  'privateKey',
  'private_key',
  'client_assertion',
  'secret',
  'apiKey',
  'key',
  '*.accessToken',
  '*.access_token',
  '*.clientSecret',
  '*.client_secret',
  '*.privateKey',
  '*.private_key',
  '*.client_assertion',
  '*.authorization',
  'req.headers["proxy-authorization"]',
  'headers["proxy-authorization"]',
  'headers["x-api-key"]',
  '*.headers.authorization',
  'res.headers["set-cookie"]',
  'password',
  'apiKeys',
  'credentials',
  'keys',
  'sealed',
  '*.token',
  '*.secret',
  '*.apiKey',
  '*.password',
  '*.key',
];

/**
 * {@link REDACT_PATHS} without the `*.` wildcards, for loggers of flat records with fixed
 * fields on the hot path (the audit line): a wildcard makes pino walk every key of every
 * logged object, which measured at about twice the cost of writing the line itself.
 */
export const FLAT_REDACT_PATHS = REDACT_PATHS.filter((p) => !p.startsWith('*'));

/** JSON logs on stdout (or `destination`), with redaction and ISO timestamps. */
export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'token-broker' },
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      formatters: { level: (label) => ({ level: label }) },
    },
    destination ?? bufferedStdout(),
  );
}

/**
 * Writes what `logger`'s destination still buffers, blocking: for `process.on('exit')`, where
 * nothing asynchronous runs any more (pino's own exit flush may already have run). A
 * destination without `flushSync` writes at once anyway.
 */
export function flushLoggerSync(logger: Logger): void {
  const stream = (logger as unknown as Record<symbol, { flushSync?(): void }>)[
    pino.symbols.streamSym
  ];
  try {
    stream.flushSync?.();
  } catch {
    // Not open yet, or already closed: nothing more can be written.
  }
}

/**
 * Stdout through pino's own destination, asynchronous and buffered: the audit trail can write
 * many lines a second, and one write(2) per line would cost more than serving a token. pino
 * flushes it synchronously on exit; the timer makes a quiet broker's lines appear promptly.
 */
function bufferedStdout(): DestinationStream {
  const dest = pino.destination({ dest: 1, sync: false, minLength: 4096 });
  setInterval(() => dest.flush(), 200).unref();
  return dest;
}

/** Routes Nest's own log calls (bootstrap, DI errors) into the same pino logger. */
export class PinoNestLogger implements LoggerService {
  constructor(private readonly logger: Logger) {}
  log(message: unknown, context?: string): void {
    this.logger.info({ context }, String(message));
  }
  error(message: unknown, trace?: string, context?: string): void {
    this.logger.error({ context, trace }, String(message));
  }
  warn(message: unknown, context?: string): void {
    this.logger.warn({ context }, String(message));
  }
  debug(message: unknown, context?: string): void {
    this.logger.debug({ context }, String(message));
  }
  verbose(message: unknown, context?: string): void {
    this.logger.trace({ context }, String(message));
  }
}
