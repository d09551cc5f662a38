import type { Logger } from 'pino';

/** Request ids kept per aggregate line: enough to find a few of the requests in other logs. */
export const AUDIT_SAMPLE_IDS = 3;

/**
 * The events of one kind (one set of fixed fields) in the current interval. A handle the hot
 * path keeps: recording into it is a few field updates, no lookup and no allocation.
 */
export class AuditAggregate {
  count = 0;
  first = 0;
  last = 0;
  reqIds: string[] = [];
  /** Whether {@link AuditAggregator} still finds this handle by its fields. */
  indexed = true;

  constructor(
    /** The fields every line of this aggregate starts with (caller, client, fingerprint...). */
    readonly fields: AuditFields,
    /** {@link fields} as one string: how {@link AuditAggregator} finds this handle again. */
    readonly key: string,
  ) {}
}

/** Fixed fields of an audit line. */
export type AuditFields = Readonly<Record<string, string | number>>;

export interface AuditAggregatorOptions {
  /** One line per event (each with its `reqId`) instead of one per interval. */
  perRequest: boolean;
}

/**
 * Audit lines that cost almost nothing per event: events with the same fixed fields (say caller, client
 * and token fingerprint) are counted and written as one line per interval, with `count`, the
 * `first` and `last` time and the first few request ids (`reqIds`). With `perRequest`, every
 * event is its own line with its `reqId`, as before aggregation existed.
 *
 * Why: at tens of thousands of tokens a second, a line per token was most of what the
 * authenticated hot path cost beyond a bare server (building, encoding and writing it), and
 * gigabytes a day of lines that say the same thing. An aggregate line still answers "which
 * caller received which token, when and how often".
 *
 * The owner calls {@link flush} every interval and at process exit, and {@link close} at
 * shutdown once the server has stopped answering; an event recorded after `close` is written at
 * once, so none is ever held back for a flush that will not come.
 */
export class AuditAggregator {
  private readonly byFields = new Map<string, AuditAggregate>();
  /** Aggregates with events since the last flush, in order of their first event. */
  private pending: AuditAggregate[] = [];
  private closed = false;

  /** Lines are written to `logger` at `info`, with this message. */
  constructor(
    private readonly logger: Logger,
    private readonly msg: string,
    private readonly options: AuditAggregatorOptions,
  ) {}

  /** Whether lines are written at all (the logger's level). */
  get enabled(): boolean {
    return this.logger.isLevelEnabled('info');
  }

  /** The handle for events with these fixed `fields`. */
  aggregate(fields: AuditFields): AuditAggregate {
    const key = JSON.stringify(fields);
    let entry = this.byFields.get(key);
    if (entry === undefined) {
      entry = new AuditAggregate(fields, key);
      this.byFields.set(key, entry);
    }
    return entry;
  }

  /**
   * Records one event of `entry` at `now` (epoch ms) for the request of `ids`. Its own line has
   * the caller's request id too; an aggregate samples the broker's ids only.
   */
  record(
    entry: AuditAggregate,
    ids: { readonly reqId: string; readonly callerRequestId?: string | undefined },
    now: number,
  ): void {
    const reqId = ids.reqId;
    if (this.options.perRequest || this.closed) {
      this.logger.info({ reqId, callerRequestId: ids.callerRequestId, ...entry.fields }, this.msg);
      return;
    }
    if (entry.count === 0) {
      entry.first = now;
      this.pending.push(entry);
      // A handle dropped as idle and used again: found by its fields again.
      if (!entry.indexed) {
        entry.indexed = true;
        if (!this.byFields.has(entry.key)) this.byFields.set(entry.key, entry);
      }
    }
    entry.count++;
    entry.last = now;
    if (entry.reqIds.length < AUDIT_SAMPLE_IDS) entry.reqIds.push(reqId);
  }

  /** Writes a line per aggregate with events since the last flush; drops idle aggregates. */
  flush(): void {
    const pending = this.pending;
    this.pending = [];
    for (const entry of this.byFields.values()) {
      if (entry.count === 0) {
        entry.indexed = false;
        this.byFields.delete(entry.key);
      }
    }
    for (const entry of pending) {
      this.logger.info(
        {
          ...entry.fields,
          count: entry.count,
          first: new Date(entry.first).toISOString(),
          last: new Date(entry.last).toISOString(),
          reqIds: entry.reqIds,
        },
        this.msg,
      );
      entry.count = 0;
      entry.reqIds = [];
    }
  }

  /** Writes what is gathered and writes every later event at once (shutdown). */
  close(): void {
    this.flush();
    this.closed = true;
  }
}
