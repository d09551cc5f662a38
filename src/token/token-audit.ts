import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { type AuditAggregate, AuditAggregator } from '../logging/audit-aggregator';
import { AuditRateLimit } from '../logging/audit-rate-limit';
import { FLAT_REDACT_PATHS, flushLoggerSync, LOGGER } from '../logging/logger';
import type { RequestIds } from '../http/request-id';
import type { TokenRecord } from './token-record';

/** What a refusal's audit line records. */
export interface TokenRefusal {
  /** The broker's id of the request. */
  reqId: string;
  /** The caller's own `X-Request-Id`, when it sent a sane one. */
  callerRequestId?: string | undefined;
  caller?: string;
  client?: string;
  /** The problem (or OAuth error) code answered. */
  result: string;
  /** What the answer hides from the caller (e.g. `unknown_client`). */
  reason?: string;
}

/** The aggregate a caller's tokens for one client are counted in, while the token stays. */
interface CallerSlot {
  record: TokenRecord;
  aggregate: AuditAggregate;
}

/**
 * The token audit trail (`"audit":"token"` lines), for `GET /token` and `POST /oauth2/token`:
 * - `token issued`: one line per caller, client and token fingerprint per
 *   `audit.intervalSeconds`, with `count`, `first`, `last` and a few `reqIds` (see
 *   {@link AuditAggregator}); one per token with its `reqId` when `audit.perRequest`;
 * - `token refused`: one line per refusal, at most `audit.refusalsPerSecond` for those of no
 *   authenticated caller and as many for each authenticated caller (see {@link AuditRateLimit});
 *   the rest are counted in a `token refusals suppressed` line (per result code, caller and
 *   client) written with the next admitted refusal or the next interval.
 *
 * Written on the interval, at shutdown (after the server has stopped answering: Nest calls
 * `onApplicationShutdown` once the HTTP server is closed) and synchronously on process exit, so
 * no token handed out is missing from the trail unless the process is killed outright.
 */
@Injectable()
export class TokenAuditTrail implements OnApplicationShutdown {
  private readonly audit: Logger;
  private readonly issuedLines: AuditAggregator;
  private readonly refusals: AuditRateLimit;
  /** Per caller, per client: the caller's current aggregate (no lookup on the hot path). */
  private readonly slots = new WeakMap<Caller, Map<string, CallerSlot>>();
  /** The slot {@link issued} used last, with its caller and client. */
  private last: { caller?: Caller; clientId?: string; slot?: CallerSlot } = {};
  private readonly timer?: NodeJS.Timeout;
  private readonly onExit = (): void => {
    this.flush();
    flushLoggerSync(this.audit);
  };
  private closed = false;

  constructor(@Inject(BROKER_CONFIG) config: BrokerConfig, @Inject(LOGGER) logger: Logger) {
    // Audit records are flat with known fields, so the cheap top-level redaction suffices.
    this.audit = logger.child(
      { audit: 'token' },
      { redact: { paths: FLAT_REDACT_PATHS, censor: '[redacted]' } },
    );
    this.issuedLines = new AuditAggregator(this.audit, 'token issued', {
      perRequest: config.audit.perRequest,
    });
    this.refusals = new AuditRateLimit(config.audit.refusalsPerSecond);
    this.timer = setInterval(() => this.flush(), config.audit.intervalSeconds * 1000);
    this.timer.unref();
    process.once('exit', this.onExit);
  }

  /** Records a token handed out to `caller` for `clientId` at `now` (epoch ms). */
  issued(
    ids: RequestIds,
    caller: Caller,
    clientId: string,
    record: TokenRecord,
    now: number,
  ): void {
    if (!this.issuedLines.enabled) return;
    // The same caller, client and token as the last time: most requests, no lookup.
    const last = this.last;
    if (last.caller === caller && last.clientId === clientId && last.slot?.record === record) {
      this.issuedLines.record(last.slot.aggregate, ids, now);
      return;
    }
    let byClient = this.slots.get(caller);
    if (byClient === undefined) {
      byClient = new Map();
      this.slots.set(caller, byClient);
    }
    let slot = byClient.get(clientId);
    if (slot === undefined || slot.record !== record) {
      slot = {
        record,
        aggregate: this.issuedLines.aggregate({
          caller: caller.name,
          client: clientId,
          fp: record.fingerprint,
          result: 'issued',
        }),
      };
      byClient.set(clientId, slot);
    }
    this.last = { caller, clientId, slot };
    this.issuedLines.record(slot.aggregate, ids, now);
  }

  /** Writes a refusal's line, unless refusals are over their rate (then it is counted). */
  refused(refusal: TokenRefusal, now = Date.now()): void {
    // After shutdown only in-flight requests remain: nothing is held back then.
    if (!this.closed && !this.refusals.admit(refusal.result, now, refusal)) return;
    this.reportSuppressed();
    this.audit.info(refusal, 'token refused');
  }

  /** Writes the aggregated lines and the count of suppressed refusals. */
  flush(): void {
    this.issuedLines.flush();
    this.reportSuppressed();
  }

  onApplicationShutdown(): void {
    this.closed = true;
    clearInterval(this.timer);
    this.issuedLines.close();
    this.reportSuppressed();
    process.removeListener('exit', this.onExit);
  }

  private reportSuppressed(): void {
    const left = this.refusals.takeSuppressed();
    if (left === undefined) return;
    this.audit.info(
      {
        suppressed: left.suppressed,
        results: left.results,
        callers: left.callers,
        clients: left.clients,
        first: new Date(left.first).toISOString(),
        last: new Date(left.last).toISOString(),
      },
      'token refusals suppressed',
    );
  }
}
