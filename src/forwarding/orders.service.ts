import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { BrokerConfig } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import type { CheckoutAnswer, CheckoutGateway } from '../provider/checkout.client';
import type { TokenService } from '../token/token.service';
import { type Exchange, Forwarding, type ForwardingAudit } from './forwarding';
import type { IdempotencyStore } from './idempotency-store';
import { bodyFingerprint, idempotencyKeyHash, type OrderHeaders } from './order-request';
import { echoesToken } from './token-echo.screen';

/** A validated `POST /orders`, ready to forward. */
export interface OrderRequest {
  readonly clientId: string;
  /** The caller's name: its `Idempotency-Key`s are its own. */
  readonly caller: string;
  /** The caller's JSON, byte for byte. */
  readonly body: Buffer;
  readonly headers: OrderHeaders;
}

/** What the caller receives: the provider's answer, live or replayed. */
export interface OrderReply {
  readonly status: number;
  readonly contentType?: string;
  /** The provider's `Retry-After` (live answers only: a stored one would be stale). */
  readonly retryAfter?: string;
  readonly body: Buffer;
  /** Answered from the idempotency store, not the provider. */
  readonly replayed: boolean;
}

/** The audit line's outcome of an order answered with the provider's answer (live or replayed). */
export function orderOutcome(result: OrderReply): { status: number; result: string } {
  return { status: result.status, result: result.replayed ? 'replayed' : 'forwarded' };
}

/** Filled in as an order goes through, for the route's audit line. Never holds a secret. */
export type OrderAudit = ForwardingAudit;

/**
 * `POST /orders`: forwards an order to the provider's checkout API with the client's token,
 * and makes sure an order is never created twice by the broker. One use of {@link Forwarding}
 * (401 handling, no resend of what may have arrived, idempotency); what is its own is the
 * target (`{base_url}{ordersPath}` through the checkout gateway, the answer collected whole
 * within `ORDERS_MAX_RESPONSE_BYTES`), the bare key as idempotency identity and the
 * `order_*` codes.
 *
 * Plain TypeScript, built by `ForwardingModule`'s factory: no Nest import, so it is unit tested
 * without the framework.
 */
export class OrdersService {
  private readonly clients: ReadonlyMap<string, ClientConfig>;
  private readonly forwarding: Forwarding;

  constructor(
    private readonly tokens: Pick<TokenService, 'resolveClient' | 'getToken' | 'replaceRejected'>,
    private readonly checkout: CheckoutGateway,
    store: IdempotencyStore,
    config: Pick<BrokerConfig, 'orders' | 'token' | 'clients'>,
    metrics: Pick<MetricsService, 'providerLatency' | 'idempotentReplays' | 'upstreamTokenEchoes'>,
    logger: Logger,
  ) {
    this.clients = new Map(config.clients.map((c) => [c.id, c]));
    this.forwarding = new Forwarding(tokens, store, config, metrics, logger, 'orders');
  }

  /**
   * Forwards `order` (or replays its recorded outcome) and returns the provider's answer,
   * whatever its status. Throws `OrdersException` or `TokenException` problems.
   */
  async create(order: OrderRequest, audit: OrderAudit): Promise<OrderReply> {
    // Resolution throws the same 400/404 problems as everywhere else for a client not configured.
    const client = this.clients.get(this.tokens.resolveClient(order.clientId))!;
    const key = order.headers.idempotencyKey;
    const exchange: Exchange<CheckoutAnswer> = {
      clientId: client.id,
      // Orders keep the bare key's hash (records written before the passthrough stay valid).
      idempotency:
        key === undefined
          ? undefined
          : {
              caller: order.caller,
              keyHash: idempotencyKeyHash(key),
              bodyHash: bodyFingerprint(order.body),
            },
      send: (token) =>
        this.checkout.createOrder({
          client,
          accessToken: token.accessToken,
          body: order.body,
          headers: order.headers.forward,
        }),
      // Collected whole already (bounded by ORDERS_MAX_RESPONSE_BYTES): nothing to drain.
      discard: () => undefined,
      screen: async (answer, tokens) => (echoesToken(answer.body, tokens) ? 'echoed' : answer),
      stored: ({ status, contentType, body }) => ({ status, contentType, body }),
    };
    const result = await this.forwarding.forward(exchange, audit);
    if (result.kind === 'replayed') return { ...result.response, replayed: true };
    const { status, contentType, retryAfter, body } = result.answer;
    return { status, contentType, retryAfter, body, replayed: false };
  }
}
