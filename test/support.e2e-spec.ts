import { spawn } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { connect, createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { Redis, type RedisOptions } from 'ioredis';
import ts from 'typescript';
import { type BrokerProcess, spawnBroker } from './support/broker-process';
import { FaultProxy } from './support/fault-proxy';
import { adoptChild, killAllManagedProcesses } from './support/managed-process';
import { hammer } from './support/load';
import { freePort } from './support/ports';
import { startRedis, type TestRedis } from './support/redis/standalone';
import { startStack } from './support/stack';
import { delay, waitFor } from './support/wait';

/** Resolves true if a redis-server answers PING on the port, false if nothing does. */
async function answersPing(port: number): Promise<boolean> {
  const client = new Redis({
    port,
    host: '127.0.0.1',
    lazyConnect: true,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    connectTimeout: 1000,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

/** Outcome of opening a raw TCP connection: whether it connected, and how it ended. */
function rawConnection(port: number): {
  socket: Socket;
  state: { connected: boolean; closed: boolean; error?: string; data: string };
} {
  const state: { connected: boolean; closed: boolean; error?: string; data: string } = {
    connected: false,
    closed: false,
    data: '',
  };
  const socket = connect({ port, host: '127.0.0.1' }, () => (state.connected = true));
  socket.on('data', (chunk: Buffer) => (state.data += chunk.toString()));
  socket.on('error', (err: NodeJS.ErrnoException) => (state.error = err.code ?? err.message));
  socket.on('close', () => (state.closed = true));
  return { socket, state };
}

describe('wait helpers', () => {
  it('waitFor returns the first truthy value of the probe', async () => {
    let n = 0;
    const value = await waitFor(() => (++n >= 3 ? { n } : null), {
      timeoutMs: 1000,
      intervalMs: 5,
      what: 'three probes',
    });
    expect(value).toEqual({ n: 3 });
  });

  it('waitFor times out naming what it waited for and the last error', async () => {
    const started = Date.now();
    await expect(
      waitFor(
        () => {
          throw new Error('not yet listening');
        },
        { timeoutMs: 150, what: 'the flag' },
      ),
    ).rejects.toThrow('timed out after 150ms waiting for the flag; last error: not yet listening');
    expect(Date.now() - started).toBeGreaterThanOrEqual(140);
  });

  it('waitFor does not let a hanging probe stretch the deadline, and stops on abort', async () => {
    const started = Date.now();
    await expect(
      waitFor(() => new Promise<boolean>(() => undefined), { timeoutMs: 100, what: 'a hang' }),
    ).rejects.toThrow(/timed out after 100ms/);
    expect(Date.now() - started).toBeLessThan(1000);

    const abort = new AbortController();
    setTimeout(() => abort.abort(new Error('the process exited')), 50);
    await expect(
      waitFor(() => false, { timeoutMs: 10_000, what: 'never', signal: abort.signal }),
    ).rejects.toThrow('the process exited');
    expect(Date.now() - started).toBeLessThan(2000);
  });
});

describe('freePort', () => {
  it('returns a loopback port that can be bound', async () => {
    const port = await freePort();
    expect(port).toBeGreaterThan(0);
    const server = createServer();
    await new Promise<void>((done, fail) => {
      server.once('error', fail);
      server.listen(port, '127.0.0.1', done);
    });
    await new Promise<void>((done) => server.close(() => done()));
  });

  it('skips a taken port, and never hands out one the kernel may give a connection', async () => {
    const ephemeralStart = Number(
      readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0],
    );
    const taken = createServer();
    const first = await freePort();
    await new Promise<void>((done) => taken.listen(first + 1, '127.0.0.1', done));
    try {
      const ports = [first];
      for (let i = 0; i < 5; i++) ports.push(await freePort());
      expect(ports).not.toContain(first + 1);
      expect(new Set(ports).size).toBe(ports.length);
      for (const port of ports) expect(port).toBeLessThan(ephemeralStart);
    } finally {
      await new Promise<void>((done) => taken.close(() => done()));
    }
  });
});

describe('startRedis', () => {
  let redis: TestRedis;
  const clients: Redis[] = [];
  const others: TestRedis[] = [];
  const savedUrl = process.env.REDIS_URL;

  function client(url: string, options: RedisOptions = {}): Redis {
    const c = new Redis(url, { maxRetriesPerRequest: 1, ...options });
    c.on('error', () => undefined);
    clients.push(c);
    return c;
  }

  beforeAll(async () => {
    redis = await startRedis({ forceLocal: true });
  });

  afterEach(() => {
    if (savedUrl === undefined) delete process.env.REDIS_URL;
    else process.env.REDIS_URL = savedUrl;
  });

  afterAll(async () => {
    for (const c of clients) c.disconnect();
    await Promise.all(others.map((r) => r.stop()));
    await redis?.stop();
  });

  it('runs a redis-server without persistence on a free loopback port, not the shared 6379', async () => {
    expect(redis.kind).toBe('process');
    expect(redis.canControl).toBe(true);
    expect(redis.port).not.toBe(6379);
    expect(redis.url).toBe(`redis://127.0.0.1:${redis.port}`);
    const c = client(redis.url);
    expect(await c.ping()).toBe('PONG');
    expect(await c.config('GET', 'save')).toEqual(['save', '']);
    expect(await c.config('GET', 'appendonly')).toEqual(['appendonly', 'no']);
  });

  it('flush() deletes every key', async () => {
    const c = client(redis.url);
    await c.mset('a', '1', 'b', '2');
    expect(await c.dbsize()).toBe(2);
    await redis.flush();
    expect(await c.dbsize()).toBe(0);
  });

  it('kill() takes it down at once; restart() brings it back empty on the same port', async () => {
    const c = client(redis.url, { retryStrategy: () => 20 });
    await c.set('survives', 'no');
    const port = redis.port;

    await redis.kill();
    expect(redis.isRunning()).toBe(false);
    expect(await answersPing(port)).toBe(false);

    await redis.restart();
    expect(redis.isRunning()).toBe(true);
    expect(redis.port).toBe(port);
    expect(await answersPing(port)).toBe(true);
    // The client created before the crash reconnects by itself and finds no data.
    const value = await waitFor(
      async () => (c.status === 'ready' ? { v: await c.get('survives') } : null),
      { timeoutMs: 5000, what: 'the old client to reconnect' },
    );
    expect(value).toEqual({ v: null });
  });

  it('stop() shuts a redis-server down and frees its port', async () => {
    const other = await startRedis({ forceLocal: true });
    others.push(other);
    expect(other.port).not.toBe(redis.port);
    expect(await answersPing(other.port)).toBe(true);
    await other.stop();
    expect(other.isRunning()).toBe(false);
    expect(await answersPing(other.port)).toBe(false);
  });

  it('uses REDIS_URL when set, and refuses to kill or restart it', async () => {
    process.env.REDIS_URL = redis.url;
    const external = await startRedis();
    expect(external.kind).toBe('external');
    expect(external.canControl).toBe(false);
    expect(external.port).toBe(redis.port);
    await expect(external.kill()).rejects.toThrow(/REDIS_URL/);
    await expect(external.restart()).rejects.toThrow(/REDIS_URL/);
    const c = client(redis.url);
    await c.set('k', 'v');
    await external.flush();
    expect(await c.dbsize()).toBe(0);
    await external.stop();
    expect(redis.isRunning()).toBe(true);
    expect(await answersPing(redis.port)).toBe(true);
  });

  it('without REDIS_URL gives a working Redis of its own, never the shared one', async () => {
    delete process.env.REDIS_URL;
    const own = await startRedis();
    others.push(own);
    expect(own.kind).not.toBe('external');
    expect(own.port).not.toBe(6379);
    expect(await client(own.url).ping()).toBe('PONG');
  });

  it('kills its redis-server when the process that started it exits without cleaning up', async () => {
    // Run the helpers, transpiled, in a plain Node process that exits right after starting
    // Redis: only the exit hook can stop that redis-server.
    const dir = mkdtempSync(join(tmpdir(), 'tb-support-'));
    try {
      mkdirSync(join(dir, 'redis'));
      // Its Redis makes its directory here: the exit hook must remove that too.
      const childTmp = join(dir, 'tmp');
      mkdirSync(childTmp);
      const modules = ['managed-process', 'ports', 'wait', 'fault-proxy', 'redis/node'];
      for (const file of [...modules, 'redis/standalone']) {
        const source = readFileSync(resolve(__dirname, 'support', `${file}.ts`), 'utf8');
        const { outputText } = ts.transpileModule(source, {
          compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 },
        });
        writeFileSync(join(dir, `${file}.js`), outputText);
      }
      const child = spawn(
        process.execPath,
        [
          '-e',
          "require('./redis/standalone').startRedis({ forceLocal: true })" +
            '.then((r) => { console.log(r.port); process.exit(0); })',
        ],
        {
          cwd: dir,
          env: {
            PATH: process.env.PATH,
            NODE_PATH: resolve(__dirname, '../node_modules'),
            TMPDIR: childTmp,
          },
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
      let out = '';
      child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
      const code = await new Promise<number | null>((done) => child.once('close', done));
      expect(code).toBe(0);
      const port = Number(out.trim());
      expect(port).toBeGreaterThan(0);
      await waitFor(async () => !(await answersPing(port)), {
        timeoutMs: 3000,
        what: `the orphaned redis-server on port ${port} to be gone`,
      });
      expect(readdirSync(childTmp)).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe(adoptChild.name, () => {
  /** A child that idles until killed, and a folder of its own. */
  function idleChild() {
    const dir = mkdtempSync(join(tmpdir(), 'tb-adopted-'));
    const child = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], {
      stdio: 'ignore',
    });
    const exit = new Promise<NodeJS.Signals | null>((done) =>
      child.once('exit', (_code, signal) => done(signal)),
    );
    adoptChild(child, dir);
    // Bounded: a child nothing killed fails the test instead of hanging it.
    const exited = Promise.race([exit, delay(3000).then(() => 'still running')]);
    return { child, dir, exited };
  }

  it("removes the child's folder once it exits", async () => {
    const { child, dir, exited } = idleChild();
    expect(existsSync(dir)).toBe(true);
    child.kill('SIGTERM');
    expect(await exited).toBe('SIGTERM');
    expect(existsSync(dir)).toBe(false);
  });

  it('puts the child in the exit hook: killed and its folder removed if the runner exits first', async () => {
    const { child, dir, exited } = idleChild();
    try {
      // What the runner's 'exit' hook calls.
      killAllManagedProcesses();
      expect(existsSync(dir)).toBe(false);
      expect(await exited).toBe('SIGKILL');
    } finally {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe(FaultProxy.name, () => {
  let redis: TestRedis;
  let proxy: FaultProxy;
  let direct: Redis;
  const clients: Redis[] = [];
  const sockets: Socket[] = [];

  function client(options: RedisOptions = {}): Redis {
    const c = new Redis(proxy.url('redis'), {
      maxRetriesPerRequest: 1,
      retryStrategy: () => 20,
      ...options,
    });
    c.on('error', () => undefined);
    clients.push(c);
    return c;
  }

  function raw(port: number) {
    const r = rawConnection(port);
    sockets.push(r.socket);
    return r;
  }

  async function rtt(c: Redis): Promise<number> {
    const started = performance.now();
    expect(await c.ping()).toBe('PONG');
    return performance.now() - started;
  }

  beforeAll(async () => {
    redis = await startRedis({ forceLocal: true });
    direct = new Redis(redis.url);
  });

  beforeEach(async () => {
    proxy = await FaultProxy.start({ target: { host: redis.host, port: redis.port } });
  });

  afterEach(async () => {
    for (const c of clients.splice(0)) c.disconnect();
    for (const s of sockets.splice(0)) s.destroy();
    await proxy.close();
  });

  afterAll(async () => {
    direct?.disconnect();
    await redis?.stop();
  });

  it('passes traffic both ways and counts it', async () => {
    const c = client();
    await c.set('through-proxy', 'yes');
    expect(await direct.get('through-proxy')).toBe('yes');
    const stats = proxy.stats;
    expect(stats.connectionsAccepted).toBe(1);
    expect(stats.activeConnections).toBe(1);
    expect(stats.bytesToTarget).toBeGreaterThan(0);
    expect(stats.bytesToClient).toBeGreaterThan(0);
    expect(stats.bytesDropped).toBe(0);
  });

  it('adds latency in each direction, keeps order, and passes fast again afterwards', async () => {
    const c = client();
    await c.ping();
    proxy.latency(150);
    expect(await rtt(c)).toBeGreaterThanOrEqual(290);

    await direct.del('counter');
    const values = await Promise.all(Array.from({ length: 100 }, () => c.incr('counter')));
    expect(values).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));

    // A chunk sent after switching back to pass must not overtake one still delayed.
    proxy.latency(300);
    const first = c.echo('first');
    await delay(20);
    proxy.pass();
    const started = performance.now();
    const second = c.echo('second');
    expect(await Promise.all([first, second])).toEqual(['first', 'second']);
    expect(performance.now() - started).toBeGreaterThanOrEqual(200);

    expect(await rtt(c)).toBeLessThan(100);
  });

  it('blackholes: connections stay open, nothing passes, clients time out', async () => {
    const c = client({ commandTimeout: 200 });
    expect(await c.ping()).toBe('PONG');
    proxy.blackhole();
    const before = proxy.stats;

    await expect(c.ping()).rejects.toThrow('Command timed out');
    expect(c.status).toBe('ready');
    const during = proxy.stats;
    expect(during.activeConnections).toBe(before.activeConnections);
    expect(during.bytesToTarget).toBe(before.bytesToTarget);
    expect(during.bytesToClient).toBe(before.bytesToClient);
    expect(during.bytesDropped).toBeGreaterThan(before.bytesDropped);

    // A new connection is accepted, and blackholed as well.
    const fresh = raw(proxy.port);
    await waitFor(() => fresh.state.connected, { timeoutMs: 2000, what: 'the TCP handshake' });
    fresh.socket.write('*1\r\n$4\r\nPING\r\n');
    await delay(300); // Deliberately letting time pass: the assertion is that nothing arrives.
    expect(fresh.state).toMatchObject({ data: '', closed: false });
    expect(proxy.stats.connectionsAccepted).toBe(before.connectionsAccepted + 1);

    // Lifting the fault: cut the desynchronised connections and let clients reconnect.
    proxy.pass();
    proxy.cut();
    await waitFor(() => fresh.state.closed, { timeoutMs: 2000, what: 'the raw socket to close' });
    await waitFor(async () => (await c.ping().catch(() => null)) === 'PONG', {
      timeoutMs: 5000,
      what: 'the client to recover',
    });
  });

  it('refuses new connections but keeps the existing ones', async () => {
    const c = client();
    expect(await c.ping()).toBe('PONG');
    proxy.refuse();

    const refused = raw(proxy.port);
    await waitFor(() => refused.state.closed, { timeoutMs: 2000, what: 'the refused socket' });
    expect(refused.state.data).toBe('');
    const late = client({
      lazyConnect: true,
      retryStrategy: () => null,
      enableOfflineQueue: false,
    });
    await expect(late.connect().then(() => late.ping())).rejects.toThrow();
    expect(proxy.stats.connectionsRefused).toBeGreaterThanOrEqual(2);

    expect(await c.ping()).toBe('PONG');

    proxy.pass();
    expect(await client().ping()).toBe('PONG');
  });

  it('cut() drops every connection now and leaves the mode as it was', async () => {
    const c = client();
    let closes = 0;
    c.on('close', () => closes++);
    expect(await c.ping()).toBe('PONG');
    proxy.latency(100);
    const accepted = proxy.stats.connectionsAccepted;

    proxy.cut();
    expect(proxy.stats.activeConnections).toBe(0);
    await waitFor(() => closes >= 1, { timeoutMs: 2000, what: 'the client to see the cut' });
    expect(proxy.mode).toEqual({ kind: 'latency', ms: 100 });

    await waitFor(() => c.status === 'ready', { timeoutMs: 5000, what: 'a reconnect' });
    expect(proxy.stats.connectionsAccepted).toBeGreaterThan(accepted);
    expect(await rtt(c)).toBeGreaterThanOrEqual(190);
  });

  it('survives a dead target: clients are reset, the proxy keeps serving', async () => {
    const dead = await FaultProxy.start({ target: { host: '127.0.0.1', port: await freePort() } });
    try {
      const r = raw(dead.port);
      await waitFor(() => r.state.closed, { timeoutMs: 2000, what: 'the client to be reset' });
      expect(r.state.connected).toBe(true);
      const again = raw(dead.port);
      await waitFor(() => again.state.closed, { timeoutMs: 2000, what: 'a second reset' });
      expect(dead.stats.connectionsAccepted).toBe(2);
      expect(dead.stats.activeConnections).toBe(0);
    } finally {
      await dead.close();
    }
  });

  it('close() ends all connections and the listener', async () => {
    const c = client({ retryStrategy: () => null });
    expect(await c.ping()).toBe('PONG');
    await proxy.close();
    await waitFor(() => c.status === 'end', { timeoutMs: 2000, what: 'the client to be closed' });
    const r = raw(proxy.port);
    await waitFor(() => r.state.closed, { timeoutMs: 2000, what: 'the connection attempt' });
    expect(r.state).toMatchObject({ connected: false, error: 'ECONNREFUSED' });
    // afterEach closes it again: that must be harmless.
  });
});

/** A stand-in for dist/main.js, driven by env: FAKE_MODE, READY_AFTER_MS. */
const FAKE_BROKER = `
const http = require('node:http');
const mode = process.env.FAKE_MODE || 'normal';
const readyAt = Date.now() + Number(process.env.READY_AFTER_MS || 0);
if (mode === 'crash') {
  console.error('config error: FAKE_SETTING is invalid');
  process.exit(78);
}
const server = http.createServer((req, res) => {
  if (req.url === '/health/ready') {
    res.writeHead(mode !== 'never-ready' && Date.now() >= readyAt ? 200 : 503).end();
  } else if (req.url === '/cwd') {
    res.writeHead(200, { 'content-type': 'text/plain' }).end(process.cwd());
  } else if (req.url === '/env') {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(process.env));
  } else {
    res.writeHead(404).end();
  }
});
process.on('SIGTERM', () => {
  console.log('got SIGTERM');
  if (mode === 'ignore-term') return;
  server.close(() => process.exit(0));
});
server.listen(Number(process.env.PORT), '127.0.0.1', () => {
  console.log('fake broker listening on ' + process.env.PORT);
  console.error('a line on stderr');
});
`;

describe(spawnBroker.name, () => {
  let dir: string;
  let script: string;
  const brokers: BrokerProcess[] = [];
  const savedUrl = process.env.REDIS_URL;

  async function fake(env: Record<string, string> = {}): Promise<BrokerProcess> {
    const b = await spawnBroker({ env, script, name: 'fake' });
    brokers.push(b);
    return b;
  }

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'tb-fake-broker-'));
    script = join(dir, 'fake-broker.js');
    mkdirSync(dir, { recursive: true });
    writeFileSync(script, FAKE_BROKER);
  });

  afterEach(() => {
    if (savedUrl === undefined) delete process.env.REDIS_URL;
    else process.env.REDIS_URL = savedUrl;
  });

  afterAll(async () => {
    await Promise.all(brokers.map((b) => b.kill()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('starts on a free port with only the given env, waits until ready, captures output', async () => {
    process.env.REDIS_URL = 'redis://must-not-leak:6379';
    const b = await fake({ READY_AFTER_MS: '300', EXTRA: 'given' });
    expect(b.url).toBe(`http://127.0.0.1:${b.port}`);
    expect(b.port).toBeGreaterThan(0);
    expect(b.pid).toEqual(expect.any(Number));
    const started = Date.now();
    await b.waitReady(10_000);
    expect(Date.now() - started).toBeGreaterThanOrEqual(150);

    const env = (await (await fetch(`${b.url}/env`)).json()) as Record<string, string>;
    expect(env.EXTRA).toBe('given');
    expect(env.PORT).toBe(String(b.port));
    expect(env.REDIS_URL).toBeUndefined();
    expect(Object.keys(env).sort()).toEqual(
      ['EXTRA', 'HOME', 'PATH', 'PORT', 'READY_AFTER_MS'].filter((k) => k in env).sort(),
    );
    expect(b.logs()).toEqual(
      expect.arrayContaining([`fake broker listening on ${b.port}`, 'a line on stderr']),
    );
  });

  it('kill() defaults to SIGKILL and reports how the process ended', async () => {
    const b = await fake();
    await b.waitReady(10_000);
    expect(await b.kill()).toEqual({ code: null, signal: 'SIGKILL' });
    expect(b.isRunning()).toBe(false);
    expect(await b.exited).toEqual({ code: null, signal: 'SIGKILL' });
    await expect(fetch(`${b.url}/env`)).rejects.toThrow();
  });

  it('stop() is graceful, and escalates to SIGKILL when SIGTERM is ignored', async () => {
    const polite = await fake();
    const stubborn = await fake({ FAKE_MODE: 'ignore-term' });
    await Promise.all([polite.waitReady(10_000), stubborn.waitReady(10_000)]);

    expect(await polite.stop()).toEqual({ code: 0, signal: null });
    expect(polite.logs()).toContain('got SIGTERM');

    const started = Date.now();
    expect(await stubborn.stop(300)).toEqual({ code: null, signal: 'SIGKILL' });
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    expect(stubborn.logs()).toContain('got SIGTERM');
  });

  it('waitReady() fails fast with the output when the process exits', async () => {
    const b = await fake({ FAKE_MODE: 'crash' });
    const started = Date.now();
    await expect(b.waitReady(10_000)).rejects.toThrow(
      /exited with code 78 before it was ready[\s\S]*config error: FAKE_SETTING is invalid/,
    );
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it('waitReady() times out with what readiness last answered', async () => {
    const b = await fake({ FAKE_MODE: 'never-ready' });
    await expect(b.waitReady(400)).rejects.toThrow(
      /timed out after 400ms waiting for fake .* to be ready; last error: GET \/health\/ready answered 503/,
    );
    expect(b.isRunning()).toBe(true);
  });

  it('passes a given PORT on verbatim, also an invalid one (for config validation tests)', async () => {
    const port = await freePort();
    const given = await fake({ PORT: String(port) });
    expect(given.port).toBe(port);
    await given.waitReady(10_000);

    const bad = await fake({ PORT: 'not-a-port' });
    expect(bad.port).toBeNaN();
    await expect(bad.waitReady(5000)).rejects.toThrow(/before it was ready/);
    expect((await bad.exited).code).not.toBe(0);
  });

  it('runs a given command from its folder, on the given env alone, as the given group', async () => {
    const cwd = join(dir, 'app');
    mkdirSync(cwd);
    // Root may run it in another group (and still read the script); anyone else in its own.
    const gid = process.getuid?.() === 0 ? 65534 : process.getgid!();
    const b = await spawnBroker({
      name: 'fake-command',
      env: { PATH: dirname(process.execPath), EXTRA: 'given' },
      command: { argv: ['node', script], cwd, uid: process.getuid!(), gid },
    });
    brokers.push(b);
    await b.waitReady(10_000);
    expect(await (await fetch(`${b.url}/cwd`)).text()).toBe(cwd);
    const env = (await (await fetch(`${b.url}/env`)).json()) as Record<string, string>;
    expect(Object.keys(env).sort()).toEqual(['EXTRA', 'PATH', 'PORT']);
    expect(env.PORT).toBe(String(b.port));
    const status = readFileSync(`/proc/${b.pid}/status`, 'utf8');
    expect(/^Gid:\s+(\d+)/m.exec(status)?.[1]).toBe(String(gid));
    expect(b.logs()).toContain(`fake broker listening on ${b.port}`);
    expect(await b.stop()).toEqual({ code: 0, signal: null });
  });

  it('outputToFile: output goes to a file of its own, read for logs() and removed after the exit', async () => {
    const b = await spawnBroker({ env: {}, script, name: 'fake-file', outputToFile: true });
    brokers.push(b);
    await b.waitReady(10_000);
    const stdout = readlinkSync(`/proc/${b.pid}/fd/1`);
    expect(stdout).toMatch(/^\//);
    expect(readlinkSync(`/proc/${b.pid}/fd/2`)).toBe(stdout);
    expect(readFileSync(stdout, 'utf8')).toContain(`fake broker listening on ${b.port}`);
    expect(b.logs()).toEqual(
      expect.arrayContaining([`fake broker listening on ${b.port}`, 'a line on stderr']),
    );
    expect(await b.stop()).toEqual({ code: 0, signal: null });
    expect(b.logs()).toContain('got SIGTERM');
    expect(existsSync(dirname(stdout))).toBe(false);

    const crashed = await spawnBroker({
      env: { FAKE_MODE: 'crash' },
      script,
      name: 'fake-file',
      outputToFile: true,
    });
    brokers.push(crashed);
    await expect(crashed.waitReady(10_000)).rejects.toThrow(
      /exited with code 78 before it was ready[\s\S]*config error: FAKE_SETTING is invalid/,
    );
  });

  it('refuses to start a script that does not exist, saying how to fix it', async () => {
    await expect(spawnBroker({ env: {}, script: join(dir, 'missing.js') })).rejects.toThrow(
      /npm run build/,
    );
  });
});

describe(hammer.name, () => {
  const servers: HttpServer[] = [];

  /** A server that counts requests and sockets; `respond` decides the answer per request. */
  async function server(respond: (n: number) => { status: number; body: string } | null) {
    const state = { requests: 0, sockets: 0, url: '' };
    const s = createHttpServer((_req, res) => {
      const answer = respond(++state.requests);
      if (answer === null) return; // Never answers: a hung upstream.
      res.writeHead(answer.status, { 'content-type': 'text/plain' }).end(answer.body);
    });
    s.on('connection', () => state.sockets++);
    await new Promise<void>((done) => s.listen(0, '127.0.0.1', done));
    const address = s.address();
    if (address === null || typeof address === 'string') throw new Error('no address');
    state.url = `http://127.0.0.1:${address.port}`;
    servers.push(s);
    return state;
  }

  afterAll(async () => {
    for (const s of servers) s.closeAllConnections();
    await Promise.all(servers.map((s) => new Promise((done) => s.close(done))));
  });

  it('runs for durationMs, round-robin, over keep-alive connections', async () => {
    const a = await server((n) => ({ status: 200, body: `a${n}` }));
    const b = await server((n) => ({ status: 200, body: `b${n}` }));
    const started = Date.now();
    const result = await hammer({
      urls: [a.url, b.url],
      path: '/x',
      concurrency: 4,
      // Long enough that a machine busy with other suites still completes a few dozen calls.
      durationMs: 1000,
    });
    const elapsed = Date.now() - started;

    expect(elapsed).toBeGreaterThanOrEqual(1000);
    expect(elapsed).toBeLessThan(5000);
    expect(result.stoppedBy).toBe('duration');
    expect(result.calls).toBe(a.requests + b.requests);
    expect(result.calls).toBeGreaterThan(20);
    expect(Math.abs(a.requests - b.requests)).toBeLessThanOrEqual(4);
    expect(result.byStatus).toEqual({ 200: result.calls });
    expect(result.failures).toEqual([]);
    expect(result.maxLatencyMs).toBeGreaterThan(0);
    // Keep-alive: a handful of sockets carried all the calls.
    expect(a.sockets + b.sockets).toBeLessThanOrEqual(8);
  });

  it('stops when until() holds', async () => {
    const a = await server(() => ({ status: 200, body: 'ok' }));
    const result = await hammer({
      urls: [a.url],
      path: '/',
      concurrency: 3,
      until: () => a.requests >= 50,
    });
    expect(result.stoppedBy).toBe('until');
    expect(result.calls).toBeGreaterThanOrEqual(50);
    expect(result.calls).toBeLessThan(50 + 3 + 1);
  });

  it('records HTTP errors, transport errors and validation errors without throwing', async () => {
    const flaky = await server((n) =>
      n % 3 === 0 ? { status: 500, body: 'upstream broke' } : { status: 200, body: 'fine' },
    );
    const deadUrl = `http://127.0.0.1:${await freePort()}`;
    const result = await hammer({
      urls: [flaky.url, deadUrl],
      path: '/',
      concurrency: 2,
      durationMs: 200,
      validate: (res) => (res.body === 'fine' ? null : `bad body from ${res.url}: ${res.body}`),
    });

    const fromFlaky = result.failures.filter((f) => f.url === flaky.url);
    const fromDead = result.failures.filter((f) => f.url === deadUrl);
    expect(fromFlaky.length).toBe(result.byStatus[500]);
    expect(fromFlaky[0]).toEqual({ url: flaky.url, status: 500, error: 'upstream broke' });
    expect(fromDead.length).toBeGreaterThan(0);
    expect(fromDead[0]).toMatchObject({ url: deadUrl, status: 0, error: /ECONNREFUSED/ });
    expect(result.failureCount).toBe(result.failures.length);
    expect(result.validationErrors.length).toBe(result.byStatus[500]);
    expect(result.validationErrors[0]).toBe(`bad body from ${flaky.url}: upstream broke`);
    expect(result.calls).toBe(flaky.requests + fromDead.length);
  });

  it('stops by itself when the target hangs, counting timeouts', async () => {
    const hung = await server(() => null);
    const started = Date.now();
    const result = await hammer({
      urls: [hung.url],
      path: '/',
      concurrency: 2,
      durationMs: 100,
      requestTimeoutMs: 300,
    });
    expect(Date.now() - started).toBeLessThan(2000);
    expect(result.calls).toBe(2);
    expect(result.failures).toHaveLength(2);
    expect(result.failures[0].status).toBe(0);
  });

  it('works through a FaultProxy, whose latency shows in maxLatencyMs', async () => {
    const a = await server(() => ({ status: 200, body: 'ok' }));
    const port = Number(new URL(a.url).port);
    const proxy = await FaultProxy.start({ target: { host: '127.0.0.1', port } });
    try {
      proxy.latency(60);
      const result = await hammer({
        urls: [proxy.url('http')],
        path: '/',
        concurrency: 2,
        durationMs: 300,
      });
      expect(result.failures).toEqual([]);
      expect(result.calls).toBeGreaterThan(0);
      expect(result.calls).toBe(a.requests);
      expect(result.maxLatencyMs).toBeGreaterThanOrEqual(110);
    } finally {
      await proxy.close();
    }
  });
});

describe(startStack.name, () => {
  /** Whether a new connection to `url`'s port is refused (nothing listens there). */
  const refused = (url: string) =>
    new Promise<boolean>((resolve) => {
      const socket = connect(Number(new URL(url).port), '127.0.0.1');
      socket.once('connect', () => {
        socket.destroy();
        resolve(false);
      });
      socket.once('error', () => resolve(true));
    });

  it('serves one config from a process and an in-process broker alike, and close() removes it all', async () => {
    const stack = await startStack({
      name: 'stack-test',
      clients: ['acme-prod', 'globex-prod'],
      redis: 'standalone',
      callerAuth: { mode: 'api-key', callers: { checkout: { clients: ['acme-prod'] } } },
      admin: true,
    });
    try {
      const inProcess = await stack.addBroker({ inProcess: true });
      expect(stack.broker.process?.pid).toEqual(expect.any(Number));
      expect(inProcess.app).toBeDefined();
      const headers = { authorization: `Bearer ${stack.keys.checkout}` };
      const tokens = await Promise.all(
        [stack.broker, inProcess].map(async (b) => {
          const res = await fetch(`${b.url}/token?client=acme-prod`, { headers });
          expect(res.status).toBe(200);
          return ((await res.json()) as { access_token: string }).access_token;
        }),
      );
      // One Redis: the second broker serves the token the first one stored.
      expect(tokens[1]).toBe(tokens[0]);
      expect(stack.provider.isValidToken(tokens[0])).toBe(true);
      expect((await fetch(`${inProcess.url}/token?client=globex-prod`, { headers })).status).toBe(
        403,
      );
      for (const b of stack.brokers) expect(b.logs().join('\n')).toContain('"level":"debug"');
      // Each, process or in-process, has an admin listener of its own.
      for (const b of stack.brokers) {
        expect(b.adminUrl).not.toBe(b.url);
        expect((await fetch(`${b.adminUrl!}/metrics`)).status).toBe(200);
      }
      expect(readFileSync(stack.configFile, 'utf8')).not.toContain(
        stack.credentials['acme-prod'].client_secret,
      );
    } finally {
      await stack.close();
    }
    expect(() => readFileSync(stack.configFile)).toThrow(/ENOENT/);
    for (const url of [stack.provider.url, ...stack.brokers.flatMap((b) => [b.url, b.adminUrl!])]) {
      expect(await refused(url)).toBe(true);
    }
    expect(await refused(stack.redis!.url!)).toBe(true);
  });

  it('tears down what it started when a broker cannot start, quoting its output', async () => {
    const before = readdirSync(tmpdir()).filter((d) => d.startsWith('tb-stack-bad-'));
    await expect(
      startStack({ name: 'stack-bad', inProcess: true, env: { TOKEN_LOCK_TTL_MS: 'soon' } }),
    ).rejects.toThrow(/stack-bad-0 did not start in-process[^]*TOKEN_LOCK_TTL_MS/);
    expect(readdirSync(tmpdir()).filter((d) => d.startsWith('tb-stack-bad-'))).toEqual(before);
  });
});
