/**
 * While draining, readiness answers 503 so the pod leaves the Service, and every answer carries
 * `Connection: close` so keep-alive callers land on another replica before the listener stops.
 * A plain object, so the Node request handler reads it without a container lookup.
 */
export class DrainState {
  private since: number | undefined;
  private stopped = false;

  /** Later calls keep the first time. */
  begin(now = Date.now()): void {
    this.since ??= now;
  }

  get draining(): boolean {
    return this.since !== undefined;
  }

  get startedAt(): number | undefined {
    return this.since;
  }

  /** The listeners stop; in-flight requests finish. */
  close(): void {
    this.stopped = true;
  }

  /** A request still arriving on an open connection is answered 503 `shutting_down`. */
  get closing(): boolean {
    return this.stopped;
  }
}
