import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { BrokerConfig, ClientConfig } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import type { CheckoutGateway, CheckoutOutcome } from '../provider/checkout.client';
import { ProviderErrorCode } from '../provider/provider.exception';
import type { TokenRecord } from '../token/token-record';
import { TokenException } from '../token/token.exception';
import type { TokenService } from '../token/token.service';
import {
  type IdempotencyRecord,
  type IdempotencyStore,
  IdempotencyStoreErrorCode,
  IdempotencyStoreException,
  type StoredResponse,
} from './idempotency-store';
import { bodyFingerprint, idempotencyKeyHash, type OrderHeaders } from './order-request';
import { OrdersErrorCode, OrdersException } from './orders.exception';

/** An order must leave with a token that outlives the trip to the provider. */
const TOKEN_MIN_REMAINING_MS = 2000;
/** Slack on an in-flight lease for event-loop delays (the store's clock sets and reads it). */
const LEASE_MARGIN_MS = 5000;

/** A validated `POST /orders`, ready to forward. */
export interface OrderRequest {
  readonly clientId: string;
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

/** Filled in as an order goes through, for the route's audit line. Never holds a secret. */
export interface OrderAudit {
  /** Fingerprint of the token of the last provider call (never the token). */
  tokenFingerprint?: string;
  /** First 16 hex digits of the SHA-256 of the `Idempotency-Key`. */
  idempotencyKeyHash?: string;
  /** Provider calls made: 0 (replayed or refused), 1, or 2 (after a 401). */
  attempts: number;
}

/** How the record of an idempotency claim is settled; a no-op without a key. */
interface Ledger {
  complete(response: StoredResponse): Promise<void>;
  markUnknown(): Promise<void>;
  release(): Promise<void>;
}

const NO_LEDGER: Ledger = {
  complete: async () => undefined,
  markUnknown: async () => undefined,
  release: async () => undefined,
};

/**
 * `POST /orders`: forwards an order to the provider's checkout API with the client's token,
 * and makes sure an order is never created twice by the broker.
 *
 * - The broker itself never repeats a request that may have reached the provider. The one
 *   retry is after a 401: the provider refused the token before looking at the order. The
 *   rejected token is invalidated by fingerprint (fenced: only if it is still the current one),
 *   so a storm of 401s across the fleet costs one token request, and the retry waits for a
 *   token *different* from the rejected one.
 * - With an `Idempotency-Key`, the key is claimed atomically before anything is sent, and the
 *   outcome is recorded: the provider's answer (replayed to repeats), or "unknown" when the
 *   order was sent and its answer lost (repeats get 409 `order_outcome_unknown` for the whole
 *   TTL, because sending it again could create a second order). A claim that certainly created
 *   nothing (not sent, 401 twice, 429, no token) is released so the caller may retry.
 * - If the idempotency store is down, requests with a key are refused (503): the broker cannot
 *   promise no duplicate. Requests without a key do not need the store and are forwarded.
 *
 * Plain TypeScript, built by `OrdersModule`'s factory: no Nest import, so it is unit tested
 * without the framework.
 */
export class OrdersService {
  private readonly ttlMs: number;
  private readonly clients: ReadonlyMap<string, ClientConfig>;
  /** How long a claim's holder is presumed alive: its longest possible run, plus slack. */
  private readonly leaseMs: number;

  constructor(
    private readonly tokens: Pick<TokenService, 'resolveClient' | 'getToken' | 'replaceRejected'>,
    private readonly checkout: CheckoutGateway,
    private readonly store: IdempotencyStore,
    config: Pick<BrokerConfig, 'orders' | 'token' | 'clients'>,
    private readonly metrics: Pick<MetricsService, 'providerLatency' | 'idempotentReplays'>,
    private readonly logger: Logger,
  ) {
    const o = config.orders;
    // Two token waits (the first token, the fresh one after a 401) and two provider calls.
    this.leaseMs =
      2 * config.token.waitTimeoutMs +
      2 * (o.connectTimeoutMs + o.headersTimeoutMs + o.bodyTimeoutMs) +
      LEASE_MARGIN_MS;
    this.ttlMs = o.idempotencyTtlSeconds * 1000;
    this.clients = new Map(config.clients.map((c) => [c.id, c]));
  }

  /**
   * Forwards `order` (or replays its recorded outcome) and returns the provider's answer,
   * whatever its status. Throws {@link OrdersException} or {@link TokenException} problems.
   */
  async create(order: OrderRequest, audit: OrderAudit): Promise<OrderReply> {
    // Resolution throws the same 400/404 problems as everywhere else for a client not configured.
    const client = this.clients.get(this.tokens.resolveClient(order.clientId))!;
    const key = order.headers.idempotencyKey;
    let ledger = NO_LEDGER;
    if (key !== undefined) {
      const claim = await this.claim(client.id, key, order.body, audit);
      if ('replay' in claim) return claim.replay;
      ledger = claim.ledger;
    }
    let outcome: CheckoutOutcome;
    try {
      outcome = await this.send(client, order, audit);
    } catch (err) {
      // No token, or every token refused with 401: nothing reached the provider that it
      // accepted, so the key may be used again. Anything unexpected errs on the safe side.
      const refused =
        err instanceof TokenException ||
        (err instanceof OrdersException && err.code === OrdersErrorCode.TokenRejected);
      await (refused ? ledger.release() : ledger.markUnknown());
      throw err;
    }
    return this.conclude(outcome, ledger, client.id, key !== undefined);
  }

  /**
   * Sends the order, and once more after a 401 with a token different from the rejected one:
   * the token layer never hands a rejected token out again ({@link TokenService.replaceRejected}).
   */
  private async send(
    client: ClientConfig,
    order: OrderRequest,
    audit: OrderAudit,
  ): Promise<CheckoutOutcome> {
    const first = await this.tokens.getToken(client.id, TOKEN_MIN_REMAINING_MS);
    const outcome = await this.attempt(client, first, order, audit);
    if (!isUnauthorized(outcome)) return outcome;

    // Fenced: a no-op when another request (or replica) already replaced this token.
    await this.tokens.replaceRejected(client.id, first.fingerprint);
    const fresh = await this.tokens.getToken(client.id, TOKEN_MIN_REMAINING_MS);
    const retried = await this.attempt(client, fresh, order, audit);
    if (!isUnauthorized(retried)) return retried;

    await this.tokens.replaceRejected(client.id, fresh.fingerprint);
    throw new OrdersException(
      OrdersErrorCode.TokenRejected,
      `the provider refused a freshly obtained token for client "${client.id}" too (HTTP 401); no order was created. Check that the merchant's credentials are enabled for the checkout API in this environment`,
    );
  }

  private async attempt(
    client: ClientConfig,
    token: TokenRecord,
    order: OrderRequest,
    audit: OrderAudit,
  ): Promise<CheckoutOutcome> {
    audit.attempts++;
    audit.tokenFingerprint = token.fingerprint;
    const started = performance.now();
    const outcome = await this.checkout.createOrder({
      client,
      accessToken: token.accessToken,
      body: order.body,
      headers: order.headers.forward,
    });
    const statusClass =
      outcome.kind === 'answered' ? `${Math.floor(outcome.status / 100)}xx` : 'none';
    this.metrics.providerLatency
      .labels('orders', statusClass)
      .observe((performance.now() - started) / 1000);
    return outcome;
  }

  /** Records the outcome and turns it into the caller's answer. */
  private async conclude(
    outcome: CheckoutOutcome,
    ledger: Ledger,
    clientId: string,
    withKey: boolean,
  ): Promise<OrderReply> {
    if (outcome.kind === 'answered') {
      const { status, contentType, body } = outcome;
      // 429: rate limited, refused before processing, so a retry under the same key is safe
      // (and replaying a stale 429 for a day would block it).
      if (status === 429) await ledger.release();
      else await ledger.complete({ status, contentType, body });
      return { status, contentType, retryAfter: outcome.retryAfter, body, replayed: false };
    }
    const { error } = outcome;
    if (outcome.delivered === 'no') {
      await ledger.release();
      throw new OrdersException(
        OrdersErrorCode.ProviderUnreachable,
        `${error.message}; the order was not sent, so it is safe to retry`,
        { retryAfterSeconds: 2, cause: error },
      );
    }
    await ledger.markUnknown();
    const advice = withKey
      ? 'the order may or may not exist. A repeat with the same Idempotency-Key answers 409 order_outcome_unknown; check with the provider before creating it again under a new key'
      : 'the order may or may not exist; check with the provider before sending it again (send an Idempotency-Key to make repeats safe)';
    this.logger.warn(
      { client: clientId, code: error.code, err: error.message },
      'order outcome unknown: sent, but no complete answer',
    );
    const code =
      error.code === ProviderErrorCode.Timeout
        ? OrdersErrorCode.ProviderTimeout
        : error.code === ProviderErrorCode.MalformedResponse
          ? OrdersErrorCode.ProviderBadResponse
          : OrdersErrorCode.ProviderUnreachable;
    const when = code === OrdersErrorCode.ProviderBadResponse ? '' : ' after the order was sent';
    throw new OrdersException(code, `${error.message}${when}: ${advice}`, {
      cause: error,
    });
  }

  /** Claims the key, or answers from what is recorded for it (replay, 409 or 422). */
  private async claim(
    clientId: string,
    key: string,
    body: Buffer,
    audit: OrderAudit,
  ): Promise<{ ledger: Ledger } | { replay: OrderReply }> {
    const keyHash = idempotencyKeyHash(key);
    audit.idempotencyKeyHash = keyHash.slice(0, 16);
    const bodyHash = bodyFingerprint(body);
    const owner = randomUUID();
    let result;
    try {
      result = await this.store.claim(
        clientId,
        keyHash,
        { bodyHash, owner, leaseMs: this.leaseMs },
        // Never shorter than a claim can be held, so a record cannot vanish mid-flight.
        Math.max(this.ttlMs, 2 * this.leaseMs),
      );
    } catch (err) {
      if (
        err instanceof IdempotencyStoreException &&
        err.code === IdempotencyStoreErrorCode.Tampered
      ) {
        this.logger.error(
          { client: clientId, idemKeyHash: audit.idempotencyKeyHash, reason: err.message },
          'idempotency record failed its integrity check: refused, nothing replayed or sent; something other than a broker writes to Redis',
        );
        throw new OrdersException(
          OrdersErrorCode.IdempotencyRecordTampered,
          'the stored outcome of this Idempotency-Key fails its integrity check (it was changed in Redis by something other than a broker), so it is not replayed; nothing was sent. Tell the platform team, and check with the provider whether the order exists before using a new key',
          { cause: err },
        );
      }
      throw storeFailure(err);
    }
    if (result.claimed) return { ledger: this.ledger(clientId, keyHash, owner) };
    return { replay: this.recorded(result.existing, bodyHash, clientId) };
  }

  private recorded(existing: IdempotencyRecord, bodyHash: string, clientId: string): OrderReply {
    if (existing.bodyHash !== bodyHash) {
      throw new OrdersException(
        OrdersErrorCode.IdempotencyKeyReused,
        'this Idempotency-Key was first used with a different body. A repeat must send the same bytes; a different order needs a new key',
      );
    }
    switch (existing.state) {
      case 'completed':
        this.metrics.idempotentReplays.labels(clientId).inc();
        return { ...existing.response, replayed: true };
      case 'in_flight':
        if (existing.leaseRemainingMs > 0) {
          throw new OrdersException(
            OrdersErrorCode.InFlight,
            'the first request with this Idempotency-Key is still being forwarded; repeat it shortly to get its answer',
            { retryAfterSeconds: 1 },
          );
        }
        // Its holder stopped mid-flight (a crashed replica): the order may have been sent.
        throw claimAbandoned();
      case 'unknown':
        throw outcomeUnknown();
    }
  }

  /** Settles a claim; a store failure is logged, never changes what the caller is told. */
  private ledger(clientId: string, keyHash: string, owner: string): Ledger {
    const settle = async (what: string, op: () => Promise<boolean>): Promise<void> => {
      try {
        if (!(await op())) {
          this.logger.warn(
            { client: clientId, idemKeyHash: keyHash.slice(0, 16) },
            `idempotency record not ${what}: the claim was no longer held`,
          );
        }
      } catch (err) {
        // The claim stays in flight until its lease ends; repeats then get
        // order_outcome_unknown, which errs on the side of never duplicating.
        this.logger.error(
          { client: clientId, idemKeyHash: keyHash.slice(0, 16), err: (err as Error).message },
          `idempotency record could not be ${what}; repeats of this key will answer 409 once its lease ends`,
        );
      }
    };
    return {
      complete: (response) =>
        settle('completed', () =>
          this.store.complete(clientId, keyHash, owner, response, this.ttlMs),
        ),
      markUnknown: () =>
        settle('marked unknown', () =>
          this.store.markUnknown(clientId, keyHash, owner, this.ttlMs),
        ),
      release: () => settle('released', () => this.store.release(clientId, keyHash, owner)),
    };
  }
}

function isUnauthorized(outcome: CheckoutOutcome): boolean {
  return outcome.kind === 'answered' && outcome.status === 401;
}

function outcomeUnknown(): OrdersException {
  return new OrdersException(
    OrdersErrorCode.OutcomeUnknown,
    'the first request with this Idempotency-Key was sent to the provider but its answer was lost, so the order may or may not exist. The broker will not send it again: check with the provider, and create the order under a new key only if it does not exist',
  );
}

/**
 * A claim whose holder's lease ran out before it recorded anything. Unlike `outcomeUnknown`,
 * nobody knows whether the order was even sent: say exactly that.
 */
function claimAbandoned(): OrdersException {
  return new OrdersException(
    OrdersErrorCode.OutcomeUnknown,
    'the broker replica that took the first request with this Idempotency-Key stopped before recording what happened to it (it crashed, or lost Redis), so the broker cannot know whether that order was sent to the provider or created. The broker will not send it again: check with the provider whether the order exists, and create it under a new key only if it does not',
  );
}

/** Fail closed: without the store, a repeat could not be recognised and might duplicate. */
function storeFailure(err: unknown): OrdersException {
  if (!(err instanceof IdempotencyStoreException)) throw err;
  const corrupt = err.code === IdempotencyStoreErrorCode.Corrupt;
  return new OrdersException(
    OrdersErrorCode.IdempotencyUnavailable,
    corrupt
      ? `${err.message}; nothing was sent`
      : 'the idempotency store (Redis) is unreachable, so a duplicate order could not be ruled out; nothing was sent. Retry shortly with the same Idempotency-Key',
    { retryAfterSeconds: corrupt ? undefined : 2, cause: err },
  );
}
