import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { freePort } from './support/ports';

const ROOT = join(__dirname, '..');

/** The shell blocks of docs/development.md's "several broker replicas" recipe, in order. */
function recipeBlocks(): string[] {
  const doc = readFileSync(join(ROOT, 'docs', 'development.md'), 'utf8');
  const from = doc.indexOf('Several broker replicas beside it');
  const to = doc.indexOf('\n## ', from);
  if (from === -1 || to === -1) throw new Error('docs/development.md: the recipe is gone');
  return [...doc.slice(from, to).matchAll(/```sh\n([\s\S]*?)```\n/g)].map((m) => m[1]);
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen({ port, host: '127.0.0.1', exclusive: true }, () =>
      server.close(() => resolve(true)),
    );
  });
}

/** A base port whose next `count` ports are free (the recipe counts ports from a base). */
async function freeRun(count: number): Promise<number> {
  for (let tried = 0; tried < 50; tried++) {
    const base = (await freePort()) - 1;
    const next = Array.from({ length: count }, (_, i) => base + 1 + i);
    if ((await Promise.all(next.map(bindable))).every(Boolean)) return base;
  }
  throw new Error(`no ${count} consecutive free ports found`);
}

/**
 * docs/development.md's local fleet, run as written by bash on ports of the test's own (the
 * recipe's are replaced, nothing else): Redis, the emulator and two brokers start, share one
 * token, the admin routes answer on the admin ports, and the last line stops every process.
 */
describe('docs/development.md: several replicas locally', () => {
  it('runs as written: one shared token, both admin ports, the secret 0600, everything stopped', async () => {
    const [setup, checks] = recipeBlocks();
    // Six consecutive free ports: Redis, the emulator, two API ports, two admin ports.
    const base = await freeRun(6);
    const [redisPort, providerPort, api, admin] = [base + 1, base + 2, base + 2, base + 4];
    const ports = (text: string) =>
      text
        .replace(
          'REDIS_PORT=6390 PROVIDER_PORT=9190',
          `REDIS_PORT=${redisPort} PROVIDER_PORT=${providerPort}`,
        )
        .replaceAll('8080 + i', `${api} + i`)
        .replaceAll('9190 + i', `${admin} + i`)
        .replaceAll('localhost:8081', `localhost:${api + 1}`)
        .replaceAll('localhost:9191', `localhost:${admin + 1}`)
        .replaceAll('localhost:9192', `localhost:${admin + 2}`);
    // The bundle is built by the test run; the emulator's build is left to the recipe.
    const script = [
      ports(setup).replace('npm run build && npm run build:dev', 'npm run build:dev --silent'),
      // What the test looks at before the recipe's last line removes it.
      'echo "secret mode: $(stat -c %a "$dir/acme.json")"',
      'echo "jobs: $(jobs -p | tr "\\n" " ")"',
      ports(checks),
    ].join('\n');
    // No port of the recipe's own is left outside its comments.
    expect(script.replace(/(^|\s)#.*$/gm, '')).not.toMatch(
      /\b(6379|6390|9090|9190|8081|8082|9191|9192)\b/,
    );
    const run = spawnSync('bash', ['-c', script], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 240_000,
    });
    const out = run.stdout;
    expect([run.status, run.stderr]).toEqual([0, expect.any(String)]);
    expect(out).not.toContain('STOP');
    // The answers as plain data.
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    type Answer = Record<string, any>;
    const json = out
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Answer);
    const [token, ready, first, second, forced] = json;
    expect(token.token_type).toBe('Bearer');
    expect(ready.details.store).toEqual({ kind: 'redis', status: 'up' });
    expect(first.replica).not.toBe(second.replica);
    const [a, b] = [first, second].map((s) => (s.clients as Answer[])[0]);
    expect(a.fingerprint).toBe(b.fingerprint);
    expect([a.lastRefresh.outcome, b.lastRefresh.outcome].sort()).toEqual(['adopted', 'fetched']);
    expect(forced.providerRequest).toBe(true);
    expect(out).toContain('secret mode: 600');
    // Every process the recipe started is gone after its last line.
    const pids = (/jobs: ([\d ]+)/.exec(out)?.[1] ?? '').trim().split(' ').map(Number);
    expect(pids).toHaveLength(4);
    const alive = pids.filter((pid) => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    });
    expect(alive).toEqual([]);
    // And nothing they started either (an `npm start` job's node outlives the npm it kills).
    const used = Array.from({ length: 6 }, (_, i) => base + 1 + i);
    expect(
      (await Promise.all(used.map(async (p) => [p, await bindable(p)]))).filter(([, ok]) => !ok),
    ).toEqual([]);
  }, 300_000);
});
