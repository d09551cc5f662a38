import { type LoggerService } from '@nestjs/common';
import pino, { type DestinationStream, type Logger } from 'pino';

export const LOGGER = 'TOKEN_BROKER:LOGGER';

/** Redacted at the top level of a logged object and one level down (`*.`). */
const SECRET_FIELDS = [
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
  'password',
];

/** Tokens and secrets are never logged on purpose: the net for the day someone logs a request. */
const REDACT_PATHS = [
  ...SECRET_FIELDS,
  ...SECRET_FIELDS.map((field) => `*.${field}`),
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-api-key"]',
  'req.headers["proxy-authorization"]',
  'res.headers["set-cookie"]',
  'headers.authorization',
  'headers.cookie',
  'headers["x-api-key"]',
  'headers["proxy-authorization"]',
  '*.headers.authorization',
  'apiKeys',
  'credentials',
  'keys',
  'sealed',
];

/** Without the `*.` wildcards: a wildcard makes pino walk every key of every logged object. */
const FLAT_REDACT_PATHS = REDACT_PATHS.filter((p) => !p.startsWith('*'));

/**
 * The child for one audit trail (`audit: <trail>` on each line). Audit records are flat, so
 * they are redacted without the wildcards, which would cost about as much as writing the line.
 */
export function auditLogger(logger: Logger, trail: string): Logger {
  return logger.child(
    { audit: trail },
    { redact: { paths: FLAT_REDACT_PATHS, censor: '[redacted]' } },
  );
}

/** Stdout unless `destination`. */
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

/** Blocking: for `process.on('exit')`, where nothing asynchronous runs any more. */
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
 * Asynchronous and buffered: one write(2) per audit line would cost more than serving a token.
 * pino flushes it on exit; the timer makes a quiet broker's lines appear promptly.
 */
function bufferedStdout(): DestinationStream {
  const dest = pino.destination({ dest: 1, sync: false, minLength: 4096 });
  setInterval(() => dest.flush(), 200).unref();
  return dest;
}

/** Nest's own log calls (bootstrap, DI errors) into the same pino logger. */
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
