import type { EndpointCap, EndpointSlot } from './token-store';

/**
 * The token requests one process sends each endpoint, within a cap: the memory store's, and a
 * replica's own while the shared store does not answer. Entries are per endpoint, so the map is
 * as small as the configuration.
 */
export class EndpointLimiter {
  /** Per endpoint: the places taken, and when each request leaves the rate (Infinity: running). */
  private readonly endpoints = new Map<
    string,
    { inFlight: Set<symbol>; counted: Map<symbol, number> }
  >();

  constructor(private readonly now: () => number = Date.now) {}

  /**
   * A request counts toward the rate from its grant until a second after it ended, as in the
   * Redis store: wherever in that span it reached the provider, no second holds more.
   */
  take(endpoint: string, cap: EndpointCap): EndpointSlot {
    let state = this.endpoints.get(endpoint);
    if (!state) {
      state = { inFlight: new Set(), counted: new Map() };
      this.endpoints.set(endpoint, state);
    }
    const now = this.now();
    for (const [place, until] of state.counted) if (until <= now) state.counted.delete(place);
    if (cap.concurrency > 0 && state.inFlight.size >= cap.concurrency) {
      return { granted: false, retryInMs: 0 };
    }
    if (cap.perSecond > 0 && state.counted.size >= cap.perSecond) {
      const first = Math.min(...state.counted.values());
      return { granted: false, retryInMs: Math.max(1, Math.min(1000, first - now)) };
    }
    const place = Symbol('token request');
    const { inFlight, counted } = state;
    inFlight.add(place);
    if (cap.perSecond > 0) counted.set(place, Infinity);
    return {
      granted: true,
      release: () => {
        inFlight.delete(place);
        if (counted.has(place)) counted.set(place, this.now() + 1000);
        return Promise.resolve();
      },
    };
  }
}
