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
  const syncSink = () => pino.destination({ dest: file, sync: true, contentMode: 'buffer' });

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-batched-'));
    file = join(dir, 'out.log');
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('holds lines until 16 KiB have gathered, then writes them in order', () => {
    const dest = new BatchedDestination(syncSink());
    const lines = Array.from({ length: 200 }, (_, i) => `line ${i} ${'x'.repeat(90)}\n`);
    let i = 0;
    for (; read() === '' && i < lines.length; i++) dest.write(lines[i]);
    const written = read();
    // Handed over once, at the first line that brought the gathered bytes to 16 KiB.
    expect(Buffer.byteLength(written)).toBeGreaterThanOrEqual(16 * 1024);
    expect(Buffer.byteLength(written)).toBeLessThan(16 * 1024 + 100);
    expect(written).toBe(lines.slice(0, i).join(''));
    for (; i < lines.length; i++) dest.write(lines[i]);
    dest.flushSync();
    expect(read()).toBe(lines.join(''));
  });

  it('keeps non-ASCII text intact and writes a line larger than a chunk whole, in order', () => {
    const dest = new BatchedDestination(syncSink());
    const big = `${'é€😀'.repeat(30_000)}\n`;
    dest.write('before ü\n');
    dest.write(big);
    dest.write('after\n');
    dest.flushSync();
    expect(read()).toBe(`before ü\n${big}after\n`);
  });

  it('flush(cb) writes a partial chunk and calls back once it is written', async () => {
    const sink = pino.destination({
      dest: file,
      sync: false,
      minLength: 4096,
      contentMode: 'buffer',
    });
    await new Promise((resolve) => sink.once('ready', resolve));
    const dest = new BatchedDestination(sink);
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
    const compiled = join(__dirname, '..', '..', 'dist-tsc', 'logging', 'batched-destination.js');
    const script = `
      const pino = require(${JSON.stringify(require.resolve('pino'))});
      const { BatchedDestination } = require(${JSON.stringify(compiled)});
      const sink = pino.destination({ dest: ${JSON.stringify(file)}, sync: false, minLength: 4096, contentMode: 'buffer' });
      const dest = new BatchedDestination(sink);
      setTimeout(() => { dest.write('last words\\n'); process.exit(1); }, 10);
    `;
    const { status } = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    expect(status).toBe(1);
    expect(read()).toBe('last words\n');
  });
});
