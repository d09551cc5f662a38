import type { IncomingHttpHeaders } from 'node:http';
import { Agent, request } from 'undici';

/** One response, as given to {@link HammerOptions.validate}. */
export interface HammerResponse {
  status: number;
  body: string;
  headers: IncomingHttpHeaders;
  /** Base URL the request went to (one of {@link HammerOptions.urls}). */
  url: string;
  /** `Date.now()` once the whole body was read: compare with expiry times in the body. */
  receivedAt: number;
  latencyMs: number;
}

/** A request that failed: a transport error (status 0) or an HTTP error status. */
export interface HammerFailure {
  url: string;
  /** HTTP status, or 0 when no response came (refused, reset, timed out). */
  status: number;
  /** Transport error message, or the start of the error response's body. */
  error: string;
}

interface HammerCommon {
  /** Base URLs (`http://127.0.0.1:port`), used round-robin. */
  urls: readonly string[];
  /** Path and query appended to each base URL. */
  path: string;
  /** @default 'GET' */
  method?: 'GET' | 'POST' | 'PUT' | 'DELETE';
  headers?: Record<string, string>;
  body?: string;
  /** Number of request loops running at once, each with one request in flight. */
  concurrency: number;
  /**
   * A request without a complete response after this long is a failure (status 0).
   * @default 5000
   */
  requestTimeoutMs?: number;
  /**
   * Which statuses count as success; others are recorded in `failures`.
   * @default status < 400
   */
  isSuccess?: (status: number) => boolean;
  /**
   * Checks each response (failed ones too); a returned string is recorded as a validation
   * error, `null` means valid. A validator that throws counts as a validation error.
   */
  validate?: (res: HammerResponse) => string | null;
  /**
   * Cap on recorded failures and validation errors (the counts stay exact), so a dead target
   * hit in a tight loop cannot fill the memory.
   * @default 10_000
   */
  maxRecorded?: number;
}

/** Options for {@link hammer}: run for `durationMs`, or until `until()` holds. */
export type HammerOptions = HammerCommon &
  (
    | {
        /** Stop starting requests after this long. */
        durationMs: number;
        /** Also stop as soon as this returns true. */
        until?: () => boolean;
      }
    | {
        /** Stop starting requests once this returns true (checked before each request). */
        until: () => boolean;
        /**
         * Deadline in case `until` never holds; `stoppedBy` then says `deadline`.
         * @default 60_000
         */
        durationMs?: number;
      }
  );

/** Outcome of {@link hammer}. */
export interface HammerResult {
  /** Requests completed or failed (every attempt counts once). */
  calls: number;
  failures: HammerFailure[];
  /** Exact number of failures, also beyond {@link HammerOptions.maxRecorded}. */
  failureCount: number;
  /** Responses per HTTP status; transport errors are not included. */
  byStatus: Record<number, number>;
  maxLatencyMs: number;
  validationErrors: string[];
  /** Exact number of validation errors. */
  validationErrorCount: number;
  durationMs: number;
  /** Why it stopped: `duration` elapsed, `until` held, or the `deadline` passed first. */
  stoppedBy: 'duration' | 'until' | 'deadline';
}

/**
 * Sends requests in `concurrency` loops over keep-alive connections, round-robin over `urls`,
 * until `durationMs` has passed or `until()` holds, and reports what happened.
 *
 * It never throws because of a request: refused connections, resets and timeouts are counted
 * as failures, so a test can assert on them (or on their absence) after the fact. It always
 * stops: no new request starts after the deadline, and the ones in flight are bounded by
 * `requestTimeoutMs`.
 */
export async function hammer(opts: HammerOptions): Promise<HammerResult> {
  if (opts.urls.length === 0) throw new RangeError('hammer needs at least one url');
  if (!(opts.concurrency >= 1)) throw new RangeError('hammer needs concurrency >= 1');
  const requestTimeoutMs = opts.requestTimeoutMs ?? 5000;
  const isSuccess = opts.isSuccess ?? ((status: number) => status < 400);
  const maxRecorded = opts.maxRecorded ?? 10_000;
  const until = opts.until;
  const hasDuration = opts.durationMs !== undefined;
  const started = Date.now();
  const deadline = started + (opts.durationMs ?? 60_000);

  // A private pool: its keep-alive sockets are closed at the end, instead of lingering in the
  // global one and keeping the test process alive.
  const agent = new Agent({
    connections: opts.concurrency,
    keepAliveTimeout: 10_000,
    connect: { timeout: requestTimeoutMs },
  });
  const result: HammerResult = {
    calls: 0,
    failures: [],
    failureCount: 0,
    byStatus: {},
    maxLatencyMs: 0,
    validationErrors: [],
    validationErrorCount: 0,
    durationMs: 0,
    stoppedBy: 'duration',
  };
  let next = 0;
  let stopReason: HammerResult['stoppedBy'] | undefined;

  const shouldStop = (): boolean => {
    if (stopReason) return true;
    if (until?.()) stopReason = 'until';
    else if (Date.now() >= deadline) stopReason = hasDuration ? 'duration' : 'deadline';
    return stopReason !== undefined;
  };
  const fail = (failure: HammerFailure) => {
    result.failureCount++;
    if (result.failures.length < maxRecorded) result.failures.push(failure);
  };
  const invalid = (message: string) => {
    result.validationErrorCount++;
    if (result.validationErrors.length < maxRecorded) result.validationErrors.push(message);
  };

  const loop = async (): Promise<void> => {
    while (!shouldStop()) {
      const url = opts.urls[next++ % opts.urls.length];
      const sentAt = performance.now();
      try {
        const res = await request(url + opts.path, {
          dispatcher: agent,
          method: opts.method ?? 'GET',
          headers: opts.headers,
          body: opts.body,
          headersTimeout: requestTimeoutMs,
          bodyTimeout: requestTimeoutMs,
          signal: AbortSignal.timeout(requestTimeoutMs),
        });
        const body = await res.body.text();
        const latencyMs = performance.now() - sentAt;
        result.calls++;
        result.maxLatencyMs = Math.max(result.maxLatencyMs, latencyMs);
        result.byStatus[res.statusCode] = (result.byStatus[res.statusCode] ?? 0) + 1;
        if (!isSuccess(res.statusCode)) {
          fail({ url, status: res.statusCode, error: body.slice(0, 200) });
        }
        if (opts.validate) {
          const response: HammerResponse = {
            status: res.statusCode,
            body,
            headers: res.headers,
            url,
            receivedAt: Date.now(),
            latencyMs,
          };
          try {
            const problem = opts.validate(response);
            if (problem !== null) invalid(problem);
          } catch (err) {
            invalid(`validate threw: ${errorMessage(err)}`);
          }
        }
      } catch (err) {
        result.calls++;
        result.maxLatencyMs = Math.max(result.maxLatencyMs, performance.now() - sentAt);
        fail({ url, status: 0, error: errorMessage(err) });
        // A refused connection fails in microseconds: yield so that a dead target does not
        // starve the event loop (and the servers under test in this same process).
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
    }
  };

  try {
    await Promise.all(Array.from({ length: opts.concurrency }, loop));
  } finally {
    await agent.close().catch(() => undefined);
  }
  result.durationMs = Date.now() - started;
  result.stoppedBy = stopReason ?? 'duration';
  return result;
}

function errorMessage(err: unknown): string {
  if (err instanceof Error) {
    // undici puts the socket-level reason (ECONNREFUSED, ECONNRESET) in `cause`.
    const cause: unknown = err.cause;
    const detail = cause instanceof Error ? `: ${cause.message}` : '';
    const code = (err as { code?: unknown }).code;
    return `${typeof code === 'string' ? `${code} ` : ''}${err.message}${detail}`;
  }
  return String(err);
}
