import type { Logger } from 'pino';
import {
  classifyRedisError,
  firstLine,
  isDroppedConnection,
  type RedisProblem,
  unresolvedHost,
} from './redis-problem';

/** `down`: an outage (degraded, ready); `misconfigured`: will not pass by itself (not ready). */
type RedisState = 'up' | 'down' | 'misconfigured';

export type StateLogger = Pick<Logger, 'info' | 'warn' | 'error'>;

/** Logs each *transition* once: an outage fails every command and reconnection, too many to log. */
export class RedisStateTracker {
  private current: RedisState = 'down';
  private currentProblem?: RedisProblem;
  private everUp = false;
  /** The first error of a replica started while Redis is unreachable is logged as the `down`. */
  private downLogged = false;
  /** The connection's error since Redis was last up: the real reason for a failure. */
  private lastConnectionReason?: string;

  /** @param addressSetting where the Redis host is written, named when it does not resolve. */
  constructor(
    private readonly logger: StateLogger,
    private readonly describe: string,
    private readonly addressSetting = 'REDIS_URL',
  ) {}

  get state(): RedisState {
    return this.current;
  }

  get problem(): RedisProblem | undefined {
    return this.current === 'misconfigured' ? this.currentProblem : undefined;
  }

  /**
   * Returns whether the state changed. An ACL problem is only cleared by the health probe: a
   * plain read succeeding next to a forbidden script must not flap the state.
   */
  succeeded(probe = true): boolean {
    if (this.current === 'up') return false;
    if (!probe && this.currentProblem?.kind === 'permission') return false;
    const from = this.current;
    this.current = 'up';
    this.currentProblem = undefined;
    this.lastConnectionReason = undefined;
    this.logger.info(
      { redis: this.describe, from, to: 'up' },
      this.everUp
        ? 'Redis back: shared store in use again'
        : 'Redis connected: shared store in use',
    );
    this.everUp = true;
    return true;
  }

  /**
   * A configuration error wins; a plain failure while misconfigured keeps that state ("Stream
   * isn't writeable" says nothing new), unless the connection reports the server went away.
   */
  failed(cause: unknown, connectionError = false): void {
    if (connectionError) this.lastConnectionReason = firstLine(cause);
    const problem =
      classifyRedisError(cause) ??
      (this.everUp ? undefined : unresolvedHost(cause, this.addressSetting));
    if (problem) {
      // Same kind, other words (EVALSHA retried as EVAL; WRONGPASS on every attempt).
      if (this.current === 'misconfigured' && this.currentProblem?.kind === problem.kind) return;
      const from = this.current;
      this.current = 'misconfigured';
      this.currentProblem = problem;
      this.logger.error(
        { redis: this.describe, from, to: 'misconfigured', problem: problem.kind },
        `Redis configuration error: ${problem.message}. Not ready until fixed; serving from memory meanwhile`,
      );
      return;
    }
    if (this.current === 'down' && (this.downLogged || !connectionError)) return;
    if (this.current === 'misconfigured' && !(connectionError && isOutage(cause))) return;
    // Another connection meeting a dropped connection is the same TLS mismatch, not an outage.
    if (this.currentProblem?.kind === 'tls' && isDroppedConnection(cause)) return;
    const from = this.current === 'down' ? 'starting' : this.current;
    this.current = 'down';
    this.currentProblem = undefined;
    this.downLogged = true;
    this.logger.warn(
      // A command's own error is often only "Stream isn't writeable": the connection's says why.
      {
        redis: this.describe,
        from,
        to: 'down',
        reason: this.lastConnectionReason ?? firstLine(cause),
      },
      'Redis unreachable: serving from memory, refreshing per replica until it returns',
    );
  }
}

function isOutage(cause: unknown): boolean {
  const code = (cause as NodeJS.ErrnoException | undefined)?.code;
  return (
    code === 'ECONNREFUSED' ||
    code === 'ECONNRESET' ||
    code === 'EHOSTUNREACH' ||
    code === 'ENOTFOUND' ||
    code === 'ETIMEDOUT' ||
    code === 'EAI_AGAIN'
  );
}
