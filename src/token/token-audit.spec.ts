import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bundleForNode } from '../../test/support/node-bundle';

const ROOT = join(__dirname, '..', '..');

/**
 * {@link TokenAuditTrail} in a plain node process (its subject is the last line written at
 * process exit; Nest 12 is ES modules only, which Jest's CommonJS runtime cannot load), writing
 * through the broker's own logger and pino's asynchronous destination to a file. The process
 * runs the two modules from `src/`, bundled by esbuild into the suite's own temporary folder,
 * their dependencies required from `node_modules`: no prior build needed.
 */
describe('TokenAuditTrail', () => {
  let build: string;
  let bundle: string;
  beforeAll(() => {
    build = mkdtempSync(join(tmpdir(), 'tb-token-audit-build-'));
    bundle = join(build, 'token-audit.js');
    bundleForNode(
      [
        "export { createLogger } from './logging/logger';",
        "export { TokenAuditTrail } from './token/token-audit';",
      ].join('\n'),
      bundle,
    );
  });
  afterAll(() => rmSync(build, { recursive: true, force: true }));

  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'tb-token-audit-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function run(body: string): Array<Record<string, unknown>> {
    const file = join(dir, 'out.log');
    const script = `
      const pino = require(${JSON.stringify(require.resolve('pino'))});
      const { createLogger, TokenAuditTrail } = require(${JSON.stringify(bundle)});
      const sink = pino.destination({ dest: ${JSON.stringify(file)}, sync: false, minLength: 4096 });
      const logger = createLogger('info', sink);
      const trail = new TokenAuditTrail(
        { audit: { intervalSeconds: 3600, perRequest: false, refusalsPerSecond: 2 } }, logger);
      const caller = { name: 'checkout', clients: '*' };
      const record = { fingerprint: '0123456789abcdef' };
      ${body}
    `;
    const { status, stderr } = spawnSync(process.execPath, ['-e', script], {
      encoding: 'utf8',
      // The bundle's dependencies (pino, Nest), from the repository's node_modules.
      env: { ...process.env, NODE_PATH: join(ROOT, 'node_modules') },
    });
    expect(stderr).toBe('');
    expect(status).toBe(1);
    return readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  }

  it('writes what it gathered when the process exits without a shutdown, refusals suppressed included', () => {
    const lines = run(`
      const now = Date.now();
      for (let i = 0; i < 5; i++) trail.issued({ reqId: 'r-' + i }, caller, 'acme-prod', record, now + i);
      trail.issued({ reqId: 'g-0' }, caller, 'globex-prod', record, now);
      for (let i = 0; i < 5; i++) trail.refused({ reqId: 'x-' + i, result: 'unauthenticated' }, now);
      setTimeout(() => process.exit(1), 10);
    `);
    expect(lines.filter((l) => l.msg === 'token refused')).toHaveLength(2);
    expect(lines).toContainEqual(
      expect.objectContaining({
        audit: 'token',
        msg: 'token issued',
        caller: 'checkout',
        client: 'acme-prod',
        fp: '0123456789abcdef',
        result: 'issued',
        count: 5,
        reqIds: ['r-0', 'r-1', 'r-2'],
      }),
    );
    expect(lines).toContainEqual(
      expect.objectContaining({ msg: 'token issued', client: 'globex-prod', count: 1 }),
    );
    expect(lines).toContainEqual(
      expect.objectContaining({
        msg: 'token refusals suppressed',
        suppressed: 3,
        results: { unauthenticated: 3 },
      }),
    );
  });

  it('counts each caller, client and token apart when they interleave (no stale shortcut)', () => {
    const lines = run(`
      const other = { name: 'billing', clients: '*' };
      const renewed = { fingerprint: 'fedcba9876543210' };
      const now = Date.now();
      const calls = [
        [caller, 'acme-prod', record], [caller, 'acme-prod', record], [other, 'acme-prod', record],
        [caller, 'acme-prod', record], [caller, 'globex-prod', record], [caller, 'acme-prod', renewed],
        [caller, 'acme-prod', renewed], [other, 'acme-prod', record],
      ];
      calls.forEach(([c, client, r], i) => trail.issued({ reqId: 'r-' + i }, c, client, r, now + i));
      setTimeout(() => process.exit(1), 10);
    `);
    const counts = lines
      .filter((l) => l.msg === 'token issued')
      .map((l) => [l.caller, l.client, l.fp, l.count]);
    expect(counts).toEqual([
      ['checkout', 'acme-prod', '0123456789abcdef', 3],
      ['billing', 'acme-prod', '0123456789abcdef', 2],
      ['checkout', 'globex-prod', '0123456789abcdef', 1],
      ['checkout', 'acme-prod', 'fedcba9876543210', 2],
    ]);
  });

  it('after shutdown, writes every token handed out at once, with its reqId', () => {
    const lines = run(`
      trail.issued({ reqId: 'r-0' }, caller, 'acme-prod', record, Date.now());
      trail.onApplicationShutdown();
      trail.issued({ reqId: 'late' }, caller, 'acme-prod', record, Date.now());
      setTimeout(() => process.exit(1), 10);
    `);
    const issued = lines.filter((l) => l.msg === 'token issued');
    expect(issued).toHaveLength(2);
    expect(issued[0]).toMatchObject({ count: 1, reqIds: ['r-0'] });
    expect(issued[1]).toMatchObject({ reqId: 'late', client: 'acme-prod' });
    expect(issued[1]).not.toHaveProperty('count');
  });
});
