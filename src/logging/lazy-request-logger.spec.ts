import { Writable } from 'node:stream';
import { createLogger } from './logger';
import { lazyChildLogger } from './lazy-request-logger';

describe(lazyChildLogger.name, () => {
  it('creates the child only on first use, with its bindings and the root redaction', () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const root = createLogger('info', sink);
    const spy = jest.spyOn(root, 'child');
    const log = lazyChildLogger(root, { reqId: 'r-1' }, {});
    expect(spy).not.toHaveBeenCalled();
    expect(log.level).toBe('info');
    log.info({ authorization: 'Bearer secret-value' }, 'hello');
    log.info('again');
    expect(spy).toHaveBeenCalledTimes(1);
    expect(lines).toHaveLength(2);
    const first = JSON.parse(lines[0]) as Record<string, unknown>;
    expect(first).toMatchObject({ reqId: 'r-1', msg: 'hello', authorization: '[redacted]' });
    expect(lines.join('')).not.toContain('secret-value');
  });
});
