import { Injectable } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/** A bounded label value. */
export type RefreshResult =
  | 'fetched'
  | 'adopted'
  | 'transient_error'
  | 'permanent_error'
  | 'credentials_error';

/** One client as the scrape-time gauges read it. */
export interface ClientGaugeState {
  client: string;
  /** The held token's expiry (epoch ms); undefined when none is valid. */
  expiresAt?: number;
  servable: boolean;
  /** Its lifecycle (`empty`, `fresh`, `refreshing`, ...): counted, never a per-client series. */
  state: string;
  /** Attempts failed in a row since the last token, and how the last one failed. */
  failures?: { count: number; result: RefreshResult };
}

/** Flushed into prom-client at scrape time. */
export interface HitCell {
  count: number;
}

/** A counter's or gauge's series as prom-client keeps them (a histogram's are skipped). */
interface SeriesOwner {
  hashMap?: Record<string, { labels: Record<string, string | number> }>;
  remove(labels: Record<string, string | number>): void;
}

const STORE_STATES = ['up', 'down', 'misconfigured'] as const;
type StoreState = (typeof STORE_STATES)[number];

/** Label values come only from configuration or fixed enums: never from callers. */
@Injectable()
export class MetricsService {
  readonly registry = new Registry();

  private clientSource: () => readonly ClientGaugeState[] = () => [];
  /**
   * Per client, one series always (the remaining lifetime) and the others only while something is
   * wrong, so a thousand clients cost a thousand series, not ten thousand; everything else is
   * aggregated over the clients. All read from one pass over the clients at each scrape.
   */
  readonly tokenRemaining: Gauge<'client'> = new Gauge({
    name: 'token_broker_token_remaining_seconds',
    help: 'Remaining lifetime of the token this replica serves, per client (0 when none), as of the scrape.',
    labelNames: ['client'] as const,
    registers: [this.registry],
    collect: (): void => this.collectClients(),
  });
  readonly clientUnservable: Gauge<'client'> = new Gauge({
    name: 'token_broker_client_unservable',
    help: 'Present (1) only for a client this replica cannot serve: it never obtained a token, its tokens live too short, or its credentials are refused with no valid token left. The admin readiness details say why.',
    labelNames: ['client'] as const,
    registers: [this.registry],
  });
  readonly clientRefreshFailures: Gauge<'client' | 'result'> = new Gauge({
    name: 'token_broker_client_refresh_failures',
    help: "Present only while a client's refresh is failing: attempts failed in a row since its last token, labelled with how the last one failed (transient_error, permanent_error, credentials_error).",
    labelNames: ['client', 'result'] as const,
    registers: [this.registry],
  });
  readonly clients: Gauge<'state'> = new Gauge({
    name: 'token_broker_clients',
    help: 'Configured clients by lifecycle state on this replica: empty (no token yet), fresh, refreshing, backing_off, rejected, revoked, expired, failed (an operator must act).',
    labelNames: ['state'] as const,
    registers: [this.registry],
  });
  readonly refreshes = new Counter({
    name: 'token_broker_refresh_total',
    help: 'Token refresh attempts of all clients by result (fetched from the provider, adopted from Redis, endpoint_capped, or failed); the failing clients are named by token_broker_client_refresh_failures.',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  readonly providerLatency = new Histogram({
    name: 'token_broker_provider_request_duration_seconds',
    help: 'Provider request latency by call and HTTP status class.',
    labelNames: ['call', 'status_class'] as const,
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [this.registry],
  });
  readonly lockAttempts = new Counter({
    name: 'token_broker_lock_attempts_total',
    help: 'Refresh lock attempts of all clients by result (acquired, held_elsewhere, error).',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  /** One cell for every client: the hot path adds to a number, the scrape flushes it. */
  private readonly l1Hits: HitCell = { count: 0 };
  readonly cacheLookups: Counter<'layer' | 'outcome'> = new Counter({
    name: 'token_broker_cache_lookups_total',
    help: 'Token lookups of all clients by layer (l1 memory, l2 Redis) and outcome (hit, miss).',
    labelNames: ['layer', 'outcome'] as const,
    registers: [this.registry],
    collect: (): void => {
      if (this.l1Hits.count > 0) {
        this.cacheLookups.inc({ layer: 'l1', outcome: 'hit' }, this.l1Hits.count);
      }
      this.l1Hits.count = 0;
    },
  });
  readonly idempotentReplays = new Counter({
    name: 'token_broker_idempotent_replays_total',
    help: 'POST /orders answered from the stored outcome of an earlier request with the same Idempotency-Key and body, per client.',
    labelNames: ['client'] as const,
    registers: [this.registry],
  });
  readonly tokenRejections = new Counter({
    name: 'token_broker_token_rejections_total',
    help: 'Provider 401s on forwarded calls, per client, call (orders, forward) and verdict: invalidated (a replacement was fetched), stale (already replaced), floored (within TOKEN_MIN_REJECTION_INTERVAL_MS), caller_budget (the caller spent TOKEN_REJECTIONS_PER_CALLER), not_evidence (no sign the token was refused: relayed as it is).',
    labelNames: ['client', 'call', 'verdict'] as const,
    registers: [this.registry],
  });
  readonly upstreamTokenEchoes = new Counter({
    name: 'token_broker_upstream_token_echoes_total',
    help: 'Provider answers that contained the access token the broker sent, withheld from the caller (502) or cut off mid-stream, per client and call (orders, forward).',
    labelNames: ['client', 'call'] as const,
    registers: [this.registry],
  });
  /** Callers are configured names: bounded. */
  readonly forwardRequests = new Counter({
    name: 'token_broker_forward_requests_total',
    help: 'Provider passthrough requests per client, caller and outcome (forwarded, replayed, rate_limited, not_allowed, or the problem code).',
    labelNames: ['client', 'caller', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly forwardRateLimitFallback = new Counter({
    name: 'token_broker_forward_rate_limit_fallback_total',
    help: 'Passthrough requests whose rate limits were counted in this replica only because Redis did not answer.',
    registers: [this.registry],
  });
  readonly ordersRateLimitFallback = new Counter({
    name: 'token_broker_orders_rate_limit_fallback_total',
    help: 'POST /orders requests whose rate limits were counted in this replica only because Redis did not answer.',
    registers: [this.registry],
  });
  /** Callers are configured names: bounded. */
  readonly budgetRefusals = new Counter({
    name: 'token_broker_budget_refusals_total',
    help: 'Requests of POST /orders (route orders) and the passthrough (forward) refused by a budget, per caller and budget: in_flight, caller_body_bytes, body_bytes (this replica), rate_client, rate_caller (fleet-wide), idempotency_records, idempotency_bytes (stored per caller and client).',
    labelNames: ['route', 'caller', 'budget'] as const,
    registers: [this.registry],
  });
  private bodyBudgetSource: () => { held: number; limit: number } = () => ({ held: 0, limit: 0 });
  readonly bodyBytesHeld: Gauge = new Gauge({
    name: 'token_broker_request_body_bytes',
    help: 'Request body bytes of POST /orders and the passthrough this replica holds now (ORDERS_BODY_BUDGET_BYTES bounds it).',
    registers: [this.registry],
    collect: (): void => this.bodyBytesHeld.set(this.bodyBudgetSource().held),
  });
  readonly bodyBudget: Gauge = new Gauge({
    name: 'token_broker_request_body_budget_bytes',
    help: 'The request body budget of this replica in bytes: ORDERS_BODY_BUDGET_BYTES, or derived from the container memory limit.',
    registers: [this.registry],
    collect: (): void => this.bodyBudget.set(this.bodyBudgetSource().limit),
  });
  private inFlightSource: (route: 'orders' | 'forward') => number = () => 0;
  readonly forwardingInFlight: Gauge<'route'> = new Gauge({
    name: 'token_broker_forwarding_in_flight',
    help: 'Requests of POST /orders (orders) and the passthrough (forward) in progress on this replica, all callers together (ORDERS_MAX_IN_FLIGHT_PER_CALLER, FORWARD_MAX_IN_FLIGHT_PER_CALLER bound each caller).',
    labelNames: ['route'] as const,
    registers: [this.registry],
    collect: (): void => {
      for (const route of ['orders', 'forward'] as const) {
        this.forwardingInFlight.set({ route }, this.inFlightSource(route));
      }
    },
  });
  readonly redisDataLoss = new Counter({
    name: 'token_broker_redis_data_loss_total',
    help: 'Clients whose data this replica found Redis had lost, by kind (lost: emptied; rolled_back: a failover to a replica that missed writes); the log names them. Idempotency records may be gone: repeats of answered orders could be created twice.',
    labelNames: ['kind'] as const,
    registers: [this.registry],
  });
  private degradedSource: () => boolean = () => false;
  readonly degraded: Gauge = new Gauge({
    name: 'token_broker_degraded',
    help: '1 while the shared store (Redis) is unreachable and this replica refreshes on its own.',
    registers: [this.registry],
    collect: (): void => this.degraded.set(this.degradedSource() ? 1 : 0),
  });
  private storeStateSource: () => StoreState | undefined = () => undefined;
  readonly storeState: Gauge<'state'> = new Gauge({
    name: 'token_broker_redis_state',
    help: 'The Redis state as this replica sees it: 1 for the current state (up, down = outage, misconfigured = credentials/ACL/TLS refused or a host that never resolved), 0 for the others. Absent without Redis.',
    labelNames: ['state'] as const,
    registers: [this.registry],
    collect: (): void => {
      const current = this.storeStateSource();
      if (current === undefined) return;
      for (const state of STORE_STATES) this.storeState.set({ state }, state === current ? 1 : 0);
    },
  });
  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: 'token_broker_' });
  }

  /** `undefined`: no Redis. */
  setStoreStateSource(source: () => StoreState | undefined): void {
    this.storeStateSource = source;
  }

  /** Each client's held token expiry and whether it is servable, read at scrape time. */
  setClientSource(source: () => readonly ClientGaugeState[]): void {
    this.clientSource = source;
  }

  setBudgetSources(
    bodies: () => { held: number; limit: number },
    inFlight: (route: 'orders' | 'forward') => number,
  ): void {
    this.bodyBudgetSource = bodies;
    this.inFlightSource = inFlight;
  }

  setDegradedSource(source: () => boolean): void {
    this.degradedSource = source;
  }

  /** A client a reload removed: its series go, so a scrape shows only configured clients. */
  forgetClient(client: string): void {
    for (const metric of this.registry.getMetricsAsArray()) {
      const series = metric as unknown as SeriesOwner;
      for (const { labels } of Object.values(series.hashMap ?? {})) {
        if (labels.client === client) series.remove(labels);
      }
    }
  }

  /** prom-client re-hashes labels per `inc()`, which costs more than the rest of a cache hit. */
  l1HitCell(): HitCell {
    return this.l1Hits;
  }

  private collectClients(): void {
    for (const g of [this.tokenRemaining, this.clientUnservable, this.clientRefreshFailures]) {
      g.reset();
    }
    const now = Date.now();
    const states = new Map<string, number>(LIFECYCLE_STATES.map((s) => [s, 0]));
    for (const c of this.clientSource()) {
      const left = c.expiresAt === undefined ? 0 : Math.max(0, (c.expiresAt - now) / 1000);
      this.tokenRemaining.set({ client: c.client }, Math.round(left * 10) / 10);
      if (!c.servable) this.clientUnservable.set({ client: c.client }, 1);
      if (c.failures !== undefined) {
        const { count, result } = c.failures;
        this.clientRefreshFailures.set({ client: c.client, result }, count);
      }
      states.set(c.state, (states.get(c.state) ?? 0) + 1);
    }
    for (const [state, n] of states) this.clients.set({ state }, n);
  }
}

/** Reported even when 0, so a dashboard's stack keeps its colours. */
const LIFECYCLE_STATES = [
  'empty',
  'fresh',
  'refreshing',
  'backing_off',
  'rejected',
  'revoked',
  'expired',
  'failed',
];
