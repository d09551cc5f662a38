import type { Logger } from 'pino';
import { classifyRedisError, type RedisProblem } from './redis-problem';

/**
 * Where the broker stands with Redis: `up` (answering), `down` (an outage: serve from memory,
 * degraded but ready) or `misconfigured` (Redis answers but refuses us, or TLS does not trust
 * it: not ready, because it will not pass by itself).
 */
export type RedisState = 'up' | 'down' | 'misconfigured';

/** The part of a logger the tracker uses. */
export type StateLogger = Pick<Logger, 'info' | 'warn' | 'error'>;

/**
 * The one place that decides the Redis state from what the connections report, and logs each
 * *transition* once. Outages and misconfigurations fail every command and every reconnection
 * attempt; logging those one by one is what produced hundreds of thousands of lines per minute.
 */
export class RedisStateTracker {
  private current: RedisState = 'down';
  private currentProblem?: RedisProblem;
  private everUp = false;
  /**
   * Whether the current `down` was logged. The tracker starts `down` without a line: the first
   * connection error of a replica started while Redis is unreachable is that transition, and
   * it is logged then (docs/operations.md's "warn once per outage" holds from start-up on).
   */
  private downLogged = false;
  /** The last connection-level error since Redis was last up: the real reason for a failure. */
  private lastConnectionReason?: string;

  constructor(
    private readonly logger: StateLogger,
    private readonly describe: string,
  ) {}

  get state(): RedisState {
    return this.current;
  }

  /** The configuration error while `misconfigured`, else `undefined`. */
  get problem(): RedisProblem | undefined {
    return this.current === 'misconfigured' ? this.currentProblem : undefined;
  }

  /**
   * A command succeeded. Returns whether the state changed (to `up`). An ACL problem is only
   * cleared by the health probe (`probe`), which exercises every permission the broker needs:
   * a plain read succeeding next to a forbidden script must not flap the state.
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
   * A command failed or a connection reported an error. A configuration error wins; a plain
   * failure while misconfigured keeps that state (the reconnection attempts in between fail
   * with "Stream isn't writeable", which says nothing new), unless it is a connection-level
   * outage (`connectionError`), which means the server itself went away.
   */
  failed(cause: unknown, connectionError = false): void {
    if (connectionError) this.lastConnectionReason = reasonOf(cause);
    const problem = classifyRedisError(cause);
    if (problem) {
      // Same kind, other words (ioredis retries EVALSHA as EVAL; WRONGPASS on every attempt):
      // nothing an operator needs to read twice.
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
    // A TLS mismatch shows as dropped or timed-out connections: another connection of the
    // replica meeting one before its own probe explained it is the same mismatch, not an outage.
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
        reason: this.lastConnectionReason ?? reasonOf(cause),
      },
      'Redis unreachable: serving from memory, refreshing per replica until it returns',
    );
  }
}

/** Errors that mean "nobody answers", as opposed to a refusal. */
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

/** What a TLS mismatch looks like from the client: the connection reset or the connect timed out. */
function isDroppedConnection(cause: unknown): boolean {
  const code = (cause as NodeJS.ErrnoException | undefined)?.code;
  return code === 'ECONNRESET' || code === 'EPIPE' || code === 'ETIMEDOUT';
}

/** A short reason for the log: the error's message, first line, bounded. */
export function reasonOf(cause: unknown): string {
  const text = cause instanceof Error ? cause.message : String(cause);
  return text.split('\n')[0].slice(0, 200);
}
