/**
 * While draining, readiness answers 503 so the pod leaves the Service, and every answer carries
 * `Connection: close` so keep-alive callers land on another replica before the listener stops.
 * A plain object, so the Node request handler reads it without a container lookup.
 */
export class DrainState {
  /** When the drain began; later calls to {@link begin} keep the first time. */
  startedAt: number | undefined;
  /** A request still arriving on an open connection is answered 503 `shutting_down`. */
  closing = false;

  begin(): void {
    this.startedAt ??= Date.now();
  }

  get draining(): boolean {
    return this.startedAt !== undefined;
  }

  /** The listeners stop; in-flight requests finish. */
  close(): void {
    this.closing = true;
  }
}
