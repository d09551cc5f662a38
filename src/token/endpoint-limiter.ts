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

/** Passes inside one gate when the fleet sets no tighter bound: the provider pool's connections. */
const NO_CAP_PASSES = 64;

interface Queued {
  urgent: () => boolean;
  enter: (entered: boolean) => void;
}

/**
 * This process's refresh passes against one token endpoint, at most a few at once: the rest wait
 * here, in memory, for their turn, instead of each reading the store, taking its client's lock and
 * asking the fleet's cap again and again. A thousand clients due together then cost the provider
 * and Redis what the cap lets through, and this process a queue entry each. A pass with callers
 * waiting on it goes before the others.
 */
export class EndpointGate {
  private inside = 0;
  private readonly queue: Queued[] = [];

  /** `passes`: how many may be inside at once. */
  constructor(readonly passes: number) {}

  /** Passes of this process inside at once: the cap's own bounds, or the provider pool's size. */
  static passesFor(cap: EndpointCap | undefined): number {
    const bounds = [cap?.concurrency ?? 0, cap?.perSecond ?? 0].filter((b) => b > 0);
    return Math.min(NO_CAP_PASSES, ...bounds);
  }

  /**
   * Resolves true once inside (call {@link leave} after), false when {@link cancel}led first.
   * `urgent` is asked whenever a place frees, so a caller arriving later still moves its pass up.
   */
  enter(urgent: () => boolean): { entered: Promise<boolean>; cancel: () => void } {
    if (this.inside < this.passes) {
      this.inside++;
      return { entered: Promise.resolve(true), cancel: () => undefined };
    }
    let queued!: Queued;
    const entered = new Promise<boolean>((enter) => {
      queued = { urgent, enter };
    });
    this.queue.push(queued);
    return {
      entered,
      cancel: () => {
        const at = this.queue.indexOf(queued);
        if (at < 0) return;
        this.queue.splice(at, 1);
        queued.enter(false);
      },
    };
  }

  leave(): void {
    if (this.queue.length === 0) {
      this.inside--;
      return;
    }
    const urgent = this.queue.findIndex((q) => q.urgent());
    const [next] = this.queue.splice(urgent < 0 ? 0 : urgent, 1);
    next.enter(true);
  }

  /** Passes waiting their turn. */
  get waiting(): number {
    return this.queue.length;
  }
}

/** One gate per endpoint, for every client of this process that asks it. */
export class EndpointGates {
  private readonly gates = new Map<string, EndpointGate>();

  of(endpoint: string, cap: EndpointCap | undefined): EndpointGate {
    let gate = this.gates.get(endpoint);
    if (gate === undefined) {
      gate = new EndpointGate(EndpointGate.passesFor(cap));
      this.gates.set(endpoint, gate);
    }
    return gate;
  }
}
