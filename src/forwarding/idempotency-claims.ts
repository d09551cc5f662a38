import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { type BrokerConfig, ordersCallDeadlineMs } from '../config/config.schema';
import type { MetricsService } from '../metrics/metrics.service';
import {
  type IdempotencyQuota,
  type IdempotencyRecord,
  type IdempotencyRef,
  type IdempotencyStore,
  IdempotencyStoreErrorCode,
  IdempotencyStoreException,
  RECORD_OVERHEAD_BYTES,
  type Settlement,
  type StoredResponse,
} from './idempotency-store';
import { forwardingProblem, type ForwardingProfile } from './forwarding.exception';
import { PROFILES } from './forwarding.profiles';

/** Slack on an in-flight lease for event-loop delays (the store's clock sets and reads it). */
const LEASE_MARGIN_MS = 5000;

/** Settles a claim; a no-op without a key ({@link NO_LEDGER}). */
export type Ledger = (settlement: Settlement) => Promise<void>;

export const NO_LEDGER: Ledger = async () => undefined;

/** How the log names each settlement. */
const SETTLED: Record<Settlement['state'], string> = {
  completed: 'completed',
  unknown: 'marked unknown',
  released: 'released',
};

/**
 * Claims an `Idempotency-Key` atomically before anything is sent. A profile keeps its records
 * for its own TTL, bounded per caller as it says.
 */
export class IdempotencyClaims {
  private readonly leaseMs: number;

  constructor(
    private readonly store: IdempotencyStore,
    private readonly config: Pick<BrokerConfig, 'orders' | 'token' | 'forward'>,
    private readonly metrics: Pick<MetricsService, 'idempotentReplays'>,
    private readonly logger: Logger,
  ) {
    // Two token waits (the first token, the fresh one after a 401) and two provider calls, each
    // ended by its deadline: the lease cannot run out while the order may still be in flight.
    this.leaseMs =
      2 * config.token.waitTimeoutMs + 2 * ordersCallDeadlineMs(config.orders) + LEASE_MARGIN_MS;
  }

  async claim(
    profile: ForwardingProfile,
    ref: IdempotencyRef,
    bodyHash: string,
  ): Promise<{ ledger: Ledger } | { replay: StoredResponse }> {
    const settings = PROFILES[profile].settings(this.config);
    const ttlMs = settings.idempotencyTtlSeconds * 1000;
    const owner = randomUUID();
    const quota = this.quota(profile);
    const result = await this.store
      .claim(
        ref,
        { bodyHash, owner, leaseMs: this.leaseMs, quota },
        // Never shorter than a claim can be held, so a record cannot vanish mid-flight.
        Math.max(ttlMs, 2 * this.leaseMs),
      )
      .catch((err: unknown) => this.claimFailed(profile, ref, err));
    if (result.claimed) return { ledger: this.ledger(ref, owner, ttlMs, quota && profile) };
    return { replay: this.recorded(profile, result.existing, bodyHash, ref.clientId) };
  }

  private recorded(
    profile: ForwardingProfile,
    existing: IdempotencyRecord,
    bodyHash: string,
    clientId: string,
  ): StoredResponse {
    const noun = PROFILES[profile].noun;
    if (existing.bodyHash !== bodyHash) {
      throw forwardingProblem(
        profile,
        'keyReused',
        `this Idempotency-Key was first used with a different body. A repeat must send the same bytes; a different ${noun} needs a new key`,
      );
    }
    switch (existing.state) {
      case 'completed':
        this.metrics.idempotentReplays.labels(clientId).inc();
        return existing.response;
      case 'in_flight':
        if (existing.leaseRemainingMs > 0) {
          throw forwardingProblem(
            profile,
            'inFlight',
            'the first request with this Idempotency-Key is still being forwarded; repeat it shortly to get its answer',
            { retryAfterSeconds: 1 },
          );
        }
        // Its holder stopped mid-flight (a crashed replica): the request may have been sent.
        // Unlike an answer lost, nobody knows whether it was even sent: say exactly that.
        throw forwardingProblem(
          profile,
          'outcomeUnknown',
          `the broker replica that took the first request with this Idempotency-Key stopped before recording what happened to it (it crashed, or lost Redis), so the broker cannot know whether that ${noun} was sent to the provider or processed. The broker will not send it again: check with the provider, and send it under a new key only if it was not processed`,
        );
      case 'unknown':
        throw forwardingProblem(
          profile,
          'outcomeUnknown',
          `the first request with this Idempotency-Key was sent to the provider but its answer was lost, so the ${noun} may or may not have been processed. The broker will not send it again: check with the provider, and send it under a new key only if it was not processed`,
        );
    }
  }

  /** The route's bounds on what one caller keeps per client; `undefined` when it has none. */
  private quota(profile: ForwardingProfile): IdempotencyQuota | undefined {
    const { recordsSetting, bytesSetting, settings } = PROFILES[profile];
    const { maxRecordsPerCaller, maxBytesPerCaller } = settings(this.config);
    if (maxRecordsPerCaller === 0 && maxBytesPerCaller === 0) return undefined;
    return {
      profile,
      maxRecords: maxRecordsPerCaller,
      maxBytes: maxBytesPerCaller,
      // Not the largest answer it may store: that would refuse legitimate bursts long before
      // the bound is near. Answers in flight when it is reached may pass it by their size,
      // which the in-flight budgets and the stored-answer limit bound.
      reserveBytes: RECORD_OVERHEAD_BYTES,
      recordsSetting,
      bytesSetting,
    };
  }

  /** Settles a claim; a store failure is logged, never changes what the caller is told. */
  private ledger(
    ref: IdempotencyRef,
    owner: string,
    ttlMs: number,
    quota: ForwardingProfile | undefined,
  ): Ledger {
    const { clientId, keyHash } = ref;
    return async (settlement) => {
      const what = SETTLED[settlement.state];
      try {
        if (!(await this.store.settle(ref, owner, settlement, ttlMs, quota))) {
          this.logger.warn(
            { client: clientId, idemKeyHash: keyHash.slice(0, 16) },
            `idempotency record not ${what}: the claim was no longer held`,
          );
        }
      } catch (err) {
        // The claim stays in flight until its lease ends; repeats then get an "outcome
        // unknown" 409, which errs on the side of never duplicating.
        this.logger.error(
          { client: clientId, idemKeyHash: keyHash.slice(0, 16), err: (err as Error).message },
          `idempotency record could not be ${what}; repeats of this key will answer 409 once its lease ends`,
        );
      }
    };
  }

  /** Fail closed: without the store, a repeat could not be recognised and might duplicate. */
  private claimFailed(profile: ForwardingProfile, ref: IdempotencyRef, err: unknown): never {
    if (!(err instanceof IdempotencyStoreException)) throw err;
    const noun = PROFILES[profile].noun;
    switch (err.code) {
      case IdempotencyStoreErrorCode.Tampered:
        this.logger.error(
          { client: ref.clientId, idemKeyHash: ref.keyHash.slice(0, 16), reason: err.message },
          'idempotency record failed its integrity check: refused, nothing replayed or sent; something other than a broker writes to Redis',
        );
        throw forwardingProblem(
          profile,
          'tampered',
          `the stored outcome of this Idempotency-Key fails its integrity check (it was changed in Redis by something other than a broker), so it is not replayed; nothing was sent. Tell the platform team, and check with the provider whether the ${noun} was processed before using a new key`,
          { cause: err },
        );
      case IdempotencyStoreErrorCode.CallerLimit:
        // Refused rather than forwarded unrecorded: the caller asked for replay protection,
        // and a retry of an unrecorded request could act twice.
        throw forwardingProblem(
          profile,
          'callerLimit',
          `${err.message}; nothing was sent. Retry after ${err.retryAfterSeconds ?? 1} s, when its oldest record expires, or send requests that need no replay protection without an Idempotency-Key`,
          { retryAfterSeconds: err.retryAfterSeconds, cause: err },
        );
      case IdempotencyStoreErrorCode.CallerBytes:
        throw forwardingProblem(
          profile,
          'callerBytes',
          `${err.message}; nothing was sent. Retry after ${err.retryAfterSeconds ?? 1} s, when records expire, or send requests that need no replay protection without an Idempotency-Key`,
          { retryAfterSeconds: err.retryAfterSeconds, cause: err },
        );
      case IdempotencyStoreErrorCode.Corrupt:
        throw forwardingProblem(profile, 'storeUnavailable', `${err.message}; nothing was sent`, {
          cause: err,
        });
      case IdempotencyStoreErrorCode.Unavailable:
        throw forwardingProblem(
          profile,
          'storeUnavailable',
          `the idempotency store (Redis) is unreachable, so a duplicate ${noun} could not be ruled out; nothing was sent. Retry shortly with the same Idempotency-Key`,
          { retryAfterSeconds: 2, cause: err },
        );
    }
  }
}
