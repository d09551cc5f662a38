import { Writable } from 'node:stream';
import { AUDIT_SAMPLE_IDS, AuditAggregator } from './audit-aggregator';
import { createLogger } from './logger';

describe(AuditAggregator.name, () => {
  function setUp(perRequest = false) {
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString().split('\n')) {
          if (l !== '') lines.push(JSON.parse(l) as Record<string, unknown>);
        }
        done();
      },
    });
    const logger = createLogger('info', sink).child({ audit: 'token' });
    return { lines, agg: new AuditAggregator(logger, 'token issued', { perRequest }) };
  }
  const fields = (caller: string, fp: string) => ({ caller, fp });
  const T0 = Date.UTC(2026, 10, 23, 18, 0, 0);

  it('writes one line per set of fields per flush, with count, first, last and the first request ids', () => {
    const { lines, agg } = setUp();
    const a = agg.aggregate(fields('checkout', 'aa'));
    const b = agg.aggregate(fields('ops', 'bb'));
    expect(agg.aggregate(fields('checkout', 'aa'))).toBe(a);
    for (let i = 0; i < 10; i++) agg.record(a, { reqId: `a-${i}` }, T0 + i * 100);
    agg.record(b, { reqId: 'b-0' }, T0 + 50);
    expect(lines).toHaveLength(0);
    agg.flush();
    expect(lines).toEqual([
      expect.objectContaining({
        level: 'info',
        audit: 'token',
        caller: 'checkout',
        fp: 'aa',
        count: 10,
        first: new Date(T0).toISOString(),
        last: new Date(T0 + 900).toISOString(),
        reqIds: ['a-0', 'a-1', 'a-2'].slice(0, AUDIT_SAMPLE_IDS),
        msg: 'token issued',
      }),
      expect.objectContaining({ caller: 'ops', fp: 'bb', count: 1, reqIds: ['b-0'] }),
    ]);
    // Nothing since: nothing written.
    agg.flush();
    expect(lines).toHaveLength(2);
    agg.record(a, { reqId: 'a-10' }, T0 + 2000);
    agg.flush();
    expect(lines[2]).toMatchObject({ caller: 'checkout', count: 1, reqIds: ['a-10'] });
  });

  it('loses no event when a handle was dropped as idle and used again', () => {
    const { lines, agg } = setUp();
    const a = agg.aggregate(fields('checkout', 'aa'));
    agg.flush(); // idle: dropped from the index
    agg.record(a, { reqId: 'r-1' }, T0);
    expect(agg.aggregate(fields('checkout', 'aa'))).toBe(a);
    agg.record(a, { reqId: 'r-2' }, T0 + 1);
    agg.flush();
    expect(lines).toEqual([expect.objectContaining({ count: 2, reqIds: ['r-1', 'r-2'] })]);
  });

  it('writes a line per event with its reqId when per-request, and after close', () => {
    const per = setUp(true);
    const a = per.agg.aggregate(fields('checkout', 'aa'));
    per.agg.record(a, { reqId: 'r-1' }, T0);
    per.agg.record(a, { reqId: 'r-2' }, T0);
    expect(per.lines.map((l) => l.reqId)).toEqual(['r-1', 'r-2']);
    expect(per.lines[0]).not.toHaveProperty('count');

    const { lines, agg } = setUp();
    const b = agg.aggregate(fields('ops', 'bb'));
    agg.record(b, { reqId: 'r-1' }, T0);
    agg.close();
    expect(lines).toEqual([expect.objectContaining({ count: 1, reqIds: ['r-1'] })]);
    agg.record(b, { reqId: 'r-2' }, T0);
    expect(lines[1]).toMatchObject({ caller: 'ops', reqId: 'r-2', msg: 'token issued' });
  });
});
