import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { BROKER_CONFIG } from '../config/config.constants';
import type { BrokerConfig } from '../config/config.schema';
import { type AuditAggregate, AuditAggregator } from '../logging/audit-aggregator';
import { AuditTrail } from '../logging/audit-trail';
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
export class TokenAuditTrail extends AuditTrail implements OnApplicationShutdown {
  private readonly issuedLines: AuditAggregator;
  /** No lookup on the hot path. */
  private readonly slots = new WeakMap<Caller, Map<string, CallerSlot>>();
  /** The slot of the last call, updated in place: callers spread over clients allocate nothing. */
  private readonly last: { caller?: Caller; clientId?: string; slot?: CallerSlot } = {};
  private readonly onExit = (): void => {
    this.flush();
    flushLoggerSync(this.logger);
  };
  private closed = false;

  constructor(@Inject(BROKER_CONFIG) config: BrokerConfig, @Inject(LOGGER) logger: Logger) {
    super(auditLogger(logger, 'token'), 'token', config.audit);
    this.issuedLines = new AuditAggregator(this.logger, 'token issued', {
      perRequest: config.audit.perRequest,
    });
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
    last.caller = caller;
    last.clientId = clientId;
    last.slot = slot;
    this.issuedLines.record(slot.aggregate, ids, now);
  }

  refused(refusal: TokenRefusal, now = Date.now()): void {
    // After shutdown only in-flight requests remain: nothing is held back then.
    if (!this.closed && !this.admit(refusal.result, now, refusal)) return;
    this.reportSuppressed();
    this.logger.info(refusal, 'token refused');
  }

  override flush(): void {
    this.issuedLines.flush();
    super.flush();
  }

  onApplicationShutdown(): void {
    this.closed = true;
    this.issuedLines.close();
    this.close();
    process.removeListener('exit', this.onExit);
  }
}
