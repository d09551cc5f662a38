/**
 * Whether this replica is draining: SIGTERM received, readiness already answering 503 so the
 * endpoints controller takes the pod out of the Service, while requests are still served for
 * `SHUTDOWN_DRAIN_DELAY_MS`. Every answer given while draining carries `Connection: close`, so
 * callers holding keep-alive connections to this pod reconnect (and land on another replica)
 * before the listener stops.
 *
 * A plain object rather than a Nest provider so the Node request handler in front of Fastify
 * (see `bootstrap.ts`) reads it without a container lookup per request.
 */
export class DrainState {
  private since: number | undefined;
  private stopped = false;

  /** Marks the start of the drain; later calls keep the first time. */
  begin(now = Date.now()): void {
    this.since ??= now;
  }

  get draining(): boolean {
    return this.since !== undefined;
  }

  /** When the drain began (epoch ms), if it has. */
  get startedAt(): number | undefined {
    return this.since;
  }

  /** Marks the end of the drain: the listeners stop, in-flight requests finish. */
  close(): void {
    this.stopped = true;
  }

  /**
   * Whether the listeners have stopped taking requests: one still arriving on an open
   * connection is answered 503 `shutting_down`, with `Connection: close`.
   */
  get closing(): boolean {
    return this.stopped;
  }
}
