import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { RedisNode } from './support/redis/node';
import { type Stack, type StackBroker, startStack } from './support/stack';
import { waitFor } from './support/wait';

const CREDS = { client_id: 'acme-merchant', client_secret: 'acme-very-secret' };
const PASSWORD = 'redis-pw-DO-NOT-LOG-1';
const OTHER_PASSWORD = 'redis-pw-DO-NOT-LOG-2';

interface Readiness {
  status: number;
  body: string;
}

/**
 * Redis refusing the broker (credentials, ACL, TLS trust) is a configuration error: readiness
 * fails naming the cause, and the broker logs it once, not once per command or reconnection.
 * An outage stays "degraded but ready". Real redis-server processes; the brokers run in the Jest
 * process (the subject is what the app reports, not the process), but for TLS (see there).
 */
describe('Redis configuration errors', () => {
  let stack: Stack;
  const brokers: StackBroker[] = [];
  const nodes: RedisNode[] = [];

  function file(name: string, content: string): string {
    const path = join(stack.dir, name);
    writeFileSync(path, content, { mode: 0o600 });
    return path;
  }

  async function redis(args: string[] = [], opts = {}): Promise<RedisNode> {
    const node = await RedisNode.start(args, opts);
    nodes.push(node);
    return node;
  }

  /**
   * A broker on the stack's config and `env`, in this process unless `inProcess` is false,
   * awaited listening only: not all become ready.
   */
  async function broker(env: Record<string, string>, inProcess = true): Promise<StackBroker> {
    const b = await stack.addBroker({ env, inProcess, wait: 'listening' });
    brokers.push(b);
    return b;
  }

  async function readiness(b: StackBroker): Promise<Readiness> {
    const res = await fetch(`${b.adminUrl!}/health/ready`);
    return { status: res.status, body: await res.text() };
  }

  /** Polls readiness until it answers `status` with a body containing `text`. */
  async function readinessBecomes(b: StackBroker, status: number, text: string) {
    return waitFor(
      async () => {
        const r = await readiness(b);
        return r.status === status && r.body.includes(text) ? r : undefined;
      },
      { timeoutMs: 15_000, intervalMs: 100, what: `readiness ${status} naming "${text}"` },
    );
  }

  /** Log lines of the store's transitions to `state`. */
  function transitions(b: StackBroker, state: 'up' | 'down' | 'misconfigured'): string[] {
    return b.logs().filter((l) => l.includes(`"to":"${state}"`));
  }

  /** Waits for the `count`th transition to `state` to be logged (logs are written in batches). */
  async function logged(b: StackBroker, state: 'up' | 'down' | 'misconfigured', count = 1) {
    await waitFor(() => transitions(b, state).length >= count, {
      timeoutMs: 5000,
      what: `log line ${count} of a transition to ${state}`,
    });
  }

  /**
   * Waits until the server has seen `count` more connections than `since`: the broker kept
   * retrying, so "logged once" is a claim about many attempts, not about one.
   */
  async function reconnectionsSeen(node: RedisNode, since: number, count: number, auth: string[]) {
    await waitFor(async () => (await connectionsReceived(node, auth)) >= since + count, {
      timeoutMs: 15_000,
      intervalMs: 100,
      what: `${count} reconnection attempts`,
    });
  }

  /** How many commands of the `evalsha`/`eval` kind the server refused or ran so far. */
  async function commandCalls(node: RedisNode, auth: string[]): Promise<number> {
    const info = await node.cli(...auth, 'INFO', 'commandstats');
    const calls = [...info.matchAll(/cmdstat_eval(?:sha)?:calls=(\d+),.*?rejected_calls=(\d+)/g)];
    return calls.reduce((sum, m) => sum + Number(m[1]) + Number(m[2]), 0);
  }

  async function connectionsReceived(node: RedisNode, auth: string[] = []): Promise<number> {
    const info = await node.cli(...auth, 'INFO', 'stats');
    return Number(/total_connections_received:(\d+)/.exec(info)?.[1]);
  }

  beforeAll(async () => {
    stack = await startStack({
      name: 'redis-errors',
      clients: [{ id: 'acme-preprod', credentials: CREDS }],
      inProcess: true,
      admin: true,
      replicas: 0,
      env: { LOG_LEVEL: 'info', REDIS_PING_INTERVAL_MS: '100' },
    });
  });

  afterEach(async () => {
    await Promise.all(brokers.splice(0).map((b) => b.stop()));
    await Promise.all(nodes.splice(0).map((n) => n.stop()));
  });

  afterAll(async () => {
    await stack?.close();
  });

  /** Checks shared by every configuration error: 503 naming it, one log line, no secret. */
  async function expectConfigurationError(
    b: StackBroker,
    node: RedisNode,
    cause: string,
    cliAuth: string[] = [],
  ): Promise<void> {
    const ready = await readinessBecomes(b, 503, cause);
    expect(ready.body).toContain('redis_misconfigured');
    const before = await connectionsReceived(node, cliAuth);
    await reconnectionsSeen(node, before, 5, cliAuth);
    await logged(b, 'misconfigured');
    expect(transitions(b, 'misconfigured')).toHaveLength(1);
    expect(transitions(b, 'misconfigured')[0]).toContain(cause);
    // No flapping between "unreachable" and "back" while the reconnections fail, and no line
    // per failed command: at most the cleartext-cache warning, the start-up notice and the error.
    expect(transitions(b, 'down')).toHaveLength(0);
    const loud = b.logs().filter((l) => /"level":"(warn|error)"/.test(l) && /redis|store/i.test(l));
    expect(loud.length).toBeLessThanOrEqual(3);
    expect(transitions(b, 'up')).toHaveLength(0);
    const everything = b.logs().join('\n') + ready.body;
    expect(everything).not.toContain(PASSWORD);
    expect(everything).not.toContain(OTHER_PASSWORD);
    // Still serving: a configuration error of the shared store does not stop GET /token.
    expect((await fetch(`${b.url}/token`)).status).toBe(200);
  }

  it('a wrong password: 503 naming WRONGPASS, logged once', async () => {
    const node = await redis(['--requirepass', PASSWORD]);
    const b = await broker({
      REDIS_URL: `redis://${node.address}`,
      REDIS_PASSWORD_FILE: file('wrong-password', `${OTHER_PASSWORD}\n`),
    });
    await expectConfigurationError(b, node, 'WRONGPASS', ['-a', PASSWORD, '--no-auth-warning']);
  }, 40_000);

  it('no password configured for a Redis that requires one: 503 naming NOAUTH', async () => {
    const node = await redis(['--requirepass', PASSWORD]);
    const b = await broker({ REDIS_URL: `redis://${node.address}` });
    await expectConfigurationError(b, node, 'NOAUTH', ['-a', PASSWORD, '--no-auth-warning']);
  }, 40_000);

  it('an ACL user without the scripting permission: 503 naming NOPERM', async () => {
    const node = await redis([
      '--user',
      'tb',
      'on',
      `>${PASSWORD}`,
      '~tb:*',
      '&*',
      '+@all',
      '-@scripting',
    ]);
    const b = await broker({
      REDIS_URL: `redis://${node.address}`,
      REDIS_USERNAME: 'tb',
      REDIS_PASSWORD_FILE: file('tb-password', PASSWORD),
    });
    const ready = await readinessBecomes(b, 503, 'NOPERM');
    expect(ready.body).toContain('redis_misconfigured');
    // The connection itself is fine, so the probe (every 100 ms) is what keeps failing, next to
    // reads that succeed: still exactly one line.
    await logged(b, 'misconfigured');
    const probes = await commandCalls(node, [
      '--user',
      'tb',
      '--pass',
      PASSWORD,
      '--no-auth-warning',
    ]);
    await waitFor(
      async () =>
        (await commandCalls(node, ['--user', 'tb', '--pass', PASSWORD, '--no-auth-warning'])) >=
        probes + 10,
      { timeoutMs: 10_000, what: '10 more refused probes' },
    );
    expect((await readiness(b)).status).toBe(503);
    expect(transitions(b, 'misconfigured')).toHaveLength(1);
    expect(transitions(b, 'up')).toHaveLength(0);
    expect(b.logs().join('\n')).not.toContain(PASSWORD);
  }, 40_000);

  it('a Redis URL naming no host: the process stops at start (exit 78) naming REDIS_URL, never the password', async () => {
    for (const url of ['redis://:6379', `rediss://:${PASSWORD}@:6379/0`, 'redis:///0']) {
      const b = await stack.addBroker({ env: { REDIS_URL: url }, inProcess: false, wait: 'none' });
      brokers.push(b);
      const exit = await b.process!.exited;
      const out = b.logs().join('\n');
      expect([url, exit.code]).toEqual([url, 78]);
      expect(out).toContain('REDIS_URL: names no host');
      expect(out).not.toContain(PASSWORD);
    }
  }, 40_000);

  // A process, as for TLS below: getaddrinfo's errors fail `instanceof Error` in Jest.
  it('a host that does not resolve at start: not ready (redis_misconfigured) naming REDIS_URL, still serving', async () => {
    const b = await broker({ REDIS_URL: 'redis://nonexistent.invalid:6379' }, false);
    const ready = await readinessBecomes(b, 503, 'redis_misconfigured');
    expect(ready.body).toContain('the Redis host does not resolve');
    expect(ready.body).toContain('ENOTFOUND');
    expect(ready.body).toContain('check the host in REDIS_URL');
    await logged(b, 'misconfigured');
    // Reconnections keep failing the same way (ioredis retries at most 2 s apart): one line.
    await new Promise((r) => setTimeout(r, 2500));
    expect(transitions(b, 'misconfigured')).toHaveLength(1);
    expect(transitions(b, 'down')).toHaveLength(0);
    expect((await readiness(b)).status).toBe(503);
    expect((await fetch(`${b.url}/token`)).status).toBe(200);
  }, 40_000);

  /**
   * Broker processes: Node's TLS errors are made outside Jest's sandbox, where `instanceof
   * Error` does not hold for them (jestjs/jest#2549), so the app in this process could not tell
   * them from an outage as it does in production.
   */
  describe('TLS', () => {
    let certs: { ca: string; otherCa: string; cert: string; key: string };
    const tlsBroker = (env: Record<string, string>) => broker(env, false);

    beforeAll(() => {
      certs = makeCertificates(stack.dir);
    });

    async function tlsRedis(extra: string[] = []): Promise<RedisNode> {
      return redis(
        [
          ...extra,
          '--tls-cert-file',
          certs.cert,
          '--tls-key-file',
          certs.key,
          '--tls-ca-cert-file',
          certs.ca,
          '--tls-auth-clients',
          'no',
        ],
        { tlsOnly: true },
      );
    }

    const tlsCli = () => ['--tls', '--cacert', certs.ca];

    it('a wrong password in a rediss:// URL: 503 naming the URL as where it came from', async () => {
      const node = await tlsRedis(['--requirepass', PASSWORD]);
      const b = await tlsBroker({
        REDIS_URL: `rediss://:${OTHER_PASSWORD}@${node.address}`,
        REDIS_TLS_CA_FILE: certs.ca,
      });
      await expectConfigurationError(b, node, 'WRONGPASS', [
        ...tlsCli(),
        '-a',
        PASSWORD,
        '--no-auth-warning',
      ]);
      const [line] = transitions(b, 'misconfigured');
      expect(line).toContain('check the user and password in REDIS_URL (redis.url)');
      expect(line).not.toContain('REDIS_PASSWORD_FILE');
      expect(JSON.stringify(await readiness(b))).toContain('REDIS_URL');
    }, 40_000);

    it('a trusted CA connects and is ready (the positive control)', async () => {
      const node = await tlsRedis();
      const b = await tlsBroker({
        REDIS_URL: `rediss://${node.address}`,
        REDIS_TLS_CA_FILE: certs.ca,
      });
      await readinessBecomes(b, 200, '"store"');
      await logged(b, 'up');
      expect(transitions(b, 'up')).toHaveLength(1);
    }, 40_000);

    it('an untrusted CA: 503 naming the certificate error, logged once', async () => {
      const node = await tlsRedis();
      const b = await tlsBroker({
        REDIS_URL: `rediss://${node.address}`,
        REDIS_TLS_CA_FILE: certs.otherCa,
      });
      // Node names the chain it saw: SELF_SIGNED_CERT_IN_CHAIN when the server sends its CA
      // along, UNABLE_TO_VERIFY_LEAF_SIGNATURE when it does not.
      await expectConfigurationError(b, node, 'TLS certificate is not trusted', tlsCli());
      expect(transitions(b, 'misconfigured')[0]).toMatch(
        /SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_VERIFY_LEAF_SIGNATURE/,
      );
    }, 40_000);

    /**
     * A TLS mismatch only ever shows as a dropped connection; the broker must still say it is
     * a setting (REDIS_TLS, the URL's scheme), not an outage, and say it once.
     */
    async function expectTlsMismatch(b: StackBroker, node: RedisNode, cliAuth: string[]) {
      const ready = await readinessBecomes(b, 503, 'REDIS_TLS');
      expect(ready.body).toContain('redis_misconfigured');
      await logged(b, 'misconfigured');
      const before = await connectionsReceived(node, cliAuth);
      await reconnectionsSeen(node, before, 3, cliAuth);
      expect((await readiness(b)).status).toBe(503);
      expect(transitions(b, 'misconfigured')).toHaveLength(1);
      expect(transitions(b, 'up')).toHaveLength(0);
      // At most the first dropped connection, before the probe told why.
      expect(transitions(b, 'down').length).toBeLessThanOrEqual(1);
      expect((await fetch(`${b.url}/token`)).status).toBe(200);
    }

    it('redis:// against a TLS-only port: 503 naming REDIS_TLS and rediss://, not "unreachable"', async () => {
      const node = await tlsRedis();
      const b = await tlsBroker({ REDIS_URL: `redis://${node.address}` });
      await expectTlsMismatch(b, node, tlsCli());
      expect(transitions(b, 'misconfigured')[0]).toContain(
        'the Redis port speaks TLS only but the broker connects in clear (a redis:// REDIS_URL and REDIS_TLS off); use a rediss:// URL or set REDIS_TLS=true',
      );
    }, 40_000);

    it('rediss:// against a plain port: 503 naming REDIS_TLS and redis://', async () => {
      const node = await redis();
      const b = await tlsBroker({ REDIS_URL: `rediss://${node.address}` });
      await expectTlsMismatch(b, node, []);
      expect(transitions(b, 'misconfigured')[0]).toContain(
        'the Redis port does not speak TLS but the broker connects with TLS (a rediss:// REDIS_URL or REDIS_TLS=true); use a redis:// URL with REDIS_TLS off, or the TLS port',
      );
    }, 40_000);

    it('a server name the certificate does not carry: 503 naming the mismatch', async () => {
      const node = await tlsRedis();
      const b = await tlsBroker({
        REDIS_URL: `rediss://${node.address}`,
        REDIS_TLS_CA_FILE: certs.ca,
        REDIS_TLS_SERVER_NAME: 'cache.elsewhere.example',
      });
      await expectConfigurationError(b, node, 'ERR_TLS_CERT_ALTNAME_INVALID', tlsCli());
    }, 40_000);
  });

  it('logs each transition once: up, down (outage), misconfigured (rotated password), up', async () => {
    const node = await redis(['--requirepass', PASSWORD]);
    const port = node.port;
    const b = await broker({
      REDIS_URL: `redis://${node.address}`,
      REDIS_PASSWORD_FILE: file('password', PASSWORD),
    });
    await readinessBecomes(b, 200, '"store"');
    await logged(b, 'up');

    // An outage: degraded but still ready.
    await node.stop();
    nodes.splice(nodes.indexOf(node), 1);
    await readinessBecomes(b, 200, 'Redis unreachable');
    await logged(b, 'down');
    expect(transitions(b, 'down')).toHaveLength(1);

    // Redis returns with a rotated password the broker does not have: not ready, says why.
    const rotated = await redis(['--requirepass', OTHER_PASSWORD], { port });
    await readinessBecomes(b, 503, 'WRONGPASS');
    const auth = ['-a', OTHER_PASSWORD, '--no-auth-warning'];
    await reconnectionsSeen(rotated, await connectionsReceived(rotated, auth), 5, auth);

    // The password is put back: ready again without a restart.
    await rotated.cli(...auth, 'CONFIG', 'SET', 'requirepass', PASSWORD);
    await readinessBecomes(b, 200, '"store"');
    await logged(b, 'up', 2);
    expect(transitions(b, 'up')).toHaveLength(2);
    expect(transitions(b, 'down')).toHaveLength(1);
    expect(transitions(b, 'misconfigured')).toHaveLength(1);
    expect(b.logs().join('\n')).not.toContain(PASSWORD);
  }, 60_000);
});

/**
 * A CA, a server certificate it signed for 127.0.0.1/localhost, and a second CA that signed
 * nothing of the server's (the "untrusted" one).
 */
function makeCertificates(dir: string): { ca: string; otherCa: string; cert: string; key: string } {
  const p = (name: string) => join(dir, name);
  const ssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
  for (const ca of ['ca', 'other-ca']) {
    ssl(
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '2',
      '-subj',
      `/CN=token-broker test ${ca}`,
      '-keyout',
      p(`${ca}.key`),
      '-out',
      p(`${ca}.crt`),
    );
  }
  ssl(
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-subj',
    '/CN=localhost',
    '-keyout',
    p('server.key'),
    '-out',
    p('server.csr'),
  );
  writeFileSync(p('server.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  ssl(
    'x509',
    '-req',
    '-in',
    p('server.csr'),
    '-CA',
    p('ca.crt'),
    '-CAkey',
    p('ca.key'),
    '-CAcreateserial',
    '-days',
    '2',
    '-extfile',
    p('server.ext'),
    '-out',
    p('server.crt'),
  );
  return {
    ca: p('ca.crt'),
    otherCa: p('other-ca.crt'),
    cert: p('server.crt'),
    key: p('server.key'),
  };
}
