import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { clientSchema } from './client.schema';
import { clientChanges, ConfigFileWatch, ConfigReloader } from './config-reload';
import { loadConfig } from './config.loader';

const client = (id: string, more: Record<string, unknown> = {}) =>
  clientSchema.parse({
    id,
    authUrl: 'http://auth.invalid',
    baseUrl: 'http://api.invalid',
    credentials: { file: '/dev/null' },
    ...more,
  });

describe(clientChanges.name, () => {
  it('names the clients added, removed and changed, and which changes keep the token', () => {
    const before = [client('a'), client('b'), client('c'), client('d')];
    const after = [
      client('a'),
      client('b', { ordersPath: '/v2/orders' }),
      client('c', { credentials: { file: '/run/c-v2' } }),
      client('e'),
    ];
    expect(clientChanges(before, after)).toEqual({
      added: ['e'],
      removed: ['d'],
      changed: ['b', 'c'],
      forwardingOnly: ['b'],
    });
  });
});

describe(ConfigReloader.name, () => {
  let dir: string;
  let file: string;
  const write = (config: unknown) => writeFileSync(file, JSON.stringify(config));
  const base = {
    nodeEnv: 'test',
    callerAuth: { mode: 'none', allowNone: true },
    http: { host: '127.0.0.1' },
    clients: [
      {
        id: 'a',
        authUrl: 'http://auth.invalid',
        baseUrl: 'http://api.invalid',
        credentials: { file: '/dev/null' },
      },
    ],
  };

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-reload-'));
    file = join(dir, 'broker.json');
    write(base);
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('applies a valid file, refuses a bad one whole, and names settings needing a restart', () => {
    const env = { BROKER_CONFIG_FILE: file };
    const reloader = new ConfigReloader(loadConfig(env), env);
    write({ ...base, clients: [...base.clients, { ...base.clients[0], id: 'b' }] });
    const good = reloader.reload();
    expect('config' in good && good.config.clients.map((c) => c.id)).toEqual(['a', 'b']);
    expect(good).toMatchObject({ restartNeeded: [] });

    write({ ...base, clients: [base.clients[0], base.clients[0]] });
    const bad = reloader.reload();
    expect(bad).toMatchObject({ error: expect.stringContaining('duplicate client id') as string });
    expect(reloader.current.clients.map((c) => c.id)).toEqual(['a', 'b']);

    write({ ...base, token: { refreshAheadSeconds: 60 } });
    expect(reloader.reload()).toMatchObject({ restartNeeded: ['token'] });
  });

  it('keeps the running configuration without a source to re-read', () => {
    const config = loadConfig({ BROKER_CONFIG_FILE: file });
    expect(new ConfigReloader(config).reload()).toEqual({ config, restartNeeded: [] });
  });
});

describe(ConfigFileWatch.name, () => {
  it('calls back once per changed content, not for a missing file or the content it saw', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tb-watch-'));
    const file = join(dir, 'broker.json');
    writeFileSync(file, 'one');
    let calls = 0;
    const watch = new ConfigFileWatch(file, 20, () => {
      calls++;
      return Promise.resolve();
    });
    try {
      await watch.start();
      await sleep(80);
      expect(calls).toBe(0);
      writeFileSync(file, 'two');
      await sleep(120);
      expect(calls).toBe(1);
      // Unreadable for a while (a ConfigMap's swap): not a change; the same content back neither.
      rmSync(file);
      await sleep(80);
      writeFileSync(file, 'two');
      await sleep(80);
      expect(calls).toBe(1);
    } finally {
      watch.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
