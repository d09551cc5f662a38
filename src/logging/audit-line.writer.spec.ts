import { Writable } from 'node:stream';
import { AuditLineWriter } from './audit-line.writer';
import { createLogger } from './logger';

describe(AuditLineWriter.name, () => {
  function capture(level = 'info') {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const child = createLogger(level, sink).child({ audit: 'token' });
    return { lines, child };
  }

  it('writes the same line pino writes for the same fields, time aside', () => {
    const { lines, child } = capture();
    const fields = { reqId: 'r-1', caller: 'checkout "eu"', client: 'acme-prod', fp: 'ab12' };
    child.info(fields, 'token issued');
    const writer = new AuditLineWriter(child, 'token issued');
    writer.write(
      Object.entries(fields)
        .map(([k, v]) => AuditLineWriter.field(k, v))
        .join(''),
    );
    expect(lines).toHaveLength(2);
    const withoutTime = (l: string) => l.replace(/"time":"[^"]+"/, '"time":"T"');
    expect(withoutTime(lines[1])).toBe(withoutTime(lines[0]));
    expect(JSON.parse(lines[1])).toMatchObject({
      level: 'info',
      service: 'token-broker',
      audit: 'token',
      ...fields,
      msg: 'token issued',
    });
    expect(lines[1].endsWith('}\n')).toBe(true);
  });

  it('reports whether info lines are enabled', () => {
    expect(new AuditLineWriter(capture('info').child, 'm').enabled).toBe(true);
    expect(new AuditLineWriter(capture('warn').child, 'm').enabled).toBe(false);
  });
});
