import type { Logger } from 'pino';

/** Enough to find a few of the requests in other logs. */
export const AUDIT_SAMPLE_IDS = 3;

/** A handle the hot path keeps: recording is a few field updates, no lookup, no allocation. */
export class AuditAggregate {
  count = 0;
  first = 0;
  last = 0;
  reqIds: string[] = [];
  indexed = true;

  constructor(
    readonly fields: AuditFields,
    readonly key: string,
  ) {}
}

type AuditFields = Readonly<Record<string, string | number>>;

/**
 * Events with the same fixed fields are written as one line per interval with `count`, `first`,
 * `last` and a few `reqIds`: a line per token was most of the hot path's cost. After {@link close}
 * an event is written at once, so none waits for a flush that will not come.
 */
export class AuditAggregator {
  private readonly byFields = new Map<string, AuditAggregate>();
  /** In order of their first event. */
  private pending: AuditAggregate[] = [];
  private closed = false;

  constructor(
    private readonly logger: Logger,
    private readonly msg: string,
    private readonly options: { perRequest: boolean },
  ) {}

  /** The logger's level. */
  get enabled(): boolean {
    return this.logger.isLevelEnabled('info');
  }

  aggregate(fields: AuditFields): AuditAggregate {
    const key = JSON.stringify(fields);
    let entry = this.byFields.get(key);
    if (entry === undefined) {
      entry = new AuditAggregate(fields, key);
      this.byFields.set(key, entry);
    }
    return entry;
  }

  /** Its own line has the caller's request id too; an aggregate samples the broker's ids only. */
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
      if (!entry.indexed) {
        entry.indexed = true;
        if (!this.byFields.has(entry.key)) this.byFields.set(entry.key, entry);
      }
    }
    entry.count++;
    entry.last = now;
    if (entry.reqIds.length < AUDIT_SAMPLE_IDS) entry.reqIds.push(reqId);
  }

  /** Drops idle aggregates. */
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

  /** Shutdown: every later event is written at once. */
  close(): void {
    this.flush();
    this.closed = true;
  }
}
