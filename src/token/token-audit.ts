import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { type AuditAggregate, AuditAggregator } from '../logging/audit-aggregator';
import { AuditRateLimit } from '../logging/audit-rate-limit';
import { auditLogger, flushLoggerSync, LOGGER } from '../logging/logger';
import type { RequestIds } from '../http/request-id';
import type { TokenRecord } from './token-record';

interface TokenRefusal {
  reqId: string;
  /** The caller's own `X-Request-Id`, when sane. */
  callerRequestId?: string | undefined;
  caller?: string;
  client?: string;
  result: string;
  /** What the answer hides from the caller (e.g. `unknown_client`). */
  reason?: string;
}

interface CallerSlot {
  record: TokenRecord;
  aggregate: AuditAggregate;
}

/**
 * The `"audit":"token"` lines: `token issued` aggregated per caller, client and fingerprint per
 * interval; `token refused` rate-limited, the rest counted. Written on the interval, at shutdown
 * and synchronously on exit, so no token handed out is missing unless the process is killed.
 */
@Injectable()
export class TokenAuditTrail implements OnApplicationShutdown {
  private readonly audit: Logger;
  private readonly issuedLines: AuditAggregator;
  private readonly refusals: AuditRateLimit;
  /** No lookup on the hot path. */
  private readonly slots = new WeakMap<Caller, Map<string, CallerSlot>>();
  private last: { caller?: Caller; clientId?: string; slot?: CallerSlot } = {};
  private readonly timer?: NodeJS.Timeout;
  private readonly onExit = (): void => {
    this.flush();
    flushLoggerSync(this.audit);
  };
  private closed = false;

  constructor(@Inject(BROKER_CONFIG) config: BrokerConfig, @Inject(LOGGER) logger: Logger) {
    this.audit = auditLogger(logger, 'token');
    this.issuedLines = new AuditAggregator(this.audit, 'token issued', {
      perRequest: config.audit.perRequest,
    });
    this.refusals = new AuditRateLimit(config.audit.refusalsPerSecond);
    this.timer = setInterval(() => this.flush(), config.audit.intervalSeconds * 1000);
    this.timer.unref();
    process.once('exit', this.onExit);
  }

  issued(
    ids: RequestIds,
    caller: Caller,
    clientId: string,
    record: TokenRecord,
    now: number,
  ): void {
    if (!this.issuedLines.enabled) return;
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

  refused(refusal: TokenRefusal, now = Date.now()): void {
    // After shutdown only in-flight requests remain: nothing is held back then.
    if (!this.closed && !this.refusals.admit(refusal.result, now, refusal)) return;
    this.reportSuppressed();
    this.audit.info(refusal, 'token refused');
  }

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
    this.refusals.reportSuppressed(this.audit, 'token');
  }
}
