import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { BatchedDestination } from './batched-destination';

describe(BatchedDestination.name, () => {
  let dir: string;
  let file: string;
  const read = () => readFileSync(file, 'utf8');

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-batched-'));
    file = join(dir, 'out.log');
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('holds lines until a batch is full, then writes them in order', () => {
    const dest = new BatchedDestination(pino.destination({ dest: file, sync: true }), 3);
    dest.write('a\n');
    dest.write('b\n');
    expect(read()).toBe('');
    dest.write('c\n');
    expect(read()).toBe('a\nb\nc\n');
    dest.write('d\n');
    expect(read()).toBe('a\nb\nc\n');
    dest.flushSync();
    expect(read()).toBe('a\nb\nc\nd\n');
  });

  it('flush(cb) writes a partial batch and calls back once it is on disk', async () => {
    const sink = pino.destination({ dest: file, sync: false, minLength: 4096 });
    await new Promise((resolve) => sink.once('ready', resolve));
    const dest = new BatchedDestination(sink, 64);
    const logger = pino({ base: null, timestamp: false }, dest);
    logger.info({ n: 1 }, 'first');
    logger.warn('second');
    expect(read()).toBe('');
    await new Promise<void>((resolve, reject) =>
      dest.flush((err) => (err ? reject(err) : resolve())),
    );
    const lines = read()
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines).toEqual([
      { level: 30, n: 1, msg: 'first' },
      { level: 40, msg: 'second' },
    ]);
  });

  it('writes what is still gathered when the process exits', () => {
    // The compiled module (`npm test` builds first): the child is a plain node process.
    const compiled = join(__dirname, '..', '..', 'dist', 'logging', 'batched-destination.js');
    const script = `
      const pino = require(${JSON.stringify(require.resolve('pino'))});
      const { BatchedDestination } = require(${JSON.stringify(compiled)});
      const dest = new BatchedDestination(pino.destination({ dest: ${JSON.stringify(file)}, sync: false, minLength: 4096 }), 64);
      setTimeout(() => { dest.write('last words\\n'); process.exit(1); }, 10);
    `;
    const { status } = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    expect(status).toBe(1);
    expect(read()).toBe('last words\n');
  });
});
