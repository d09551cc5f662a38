import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type Redis from 'ioredis';
import type { ProviderEmulator } from '../emulator/provider-emulator';
import { FaultProxy } from './support/fault-proxy';
import { FLEET_CLIENT, FLEET_CREDENTIALS } from './support/fleet';
import type { RedisTopology } from './support/redis/topology';
import { type Stack, type StackBroker, startStack } from './support/stack';
import { delay, waitFor } from './support/wait';

/**
 * The admin listener and routes (issue #16) on three real broker processes, each reaching Redis
 * through a fault proxy of its own so that one can be cut off: scopes and audit lines, a forced
 * refresh fleet-wide, and a revoke while one replica is partitioned from Redis. Processes, not
 * in-process brokers: a replica is known to the fleet by host and pid (REPLICA_ID), whom a
 * revoke is acknowledged by and whose reload requests the others act on.
 */
const ADMIN_KEY = 'admin-key-0123456789abcdef0123456789abcdef';
const CALLER_KEY = 'caller-key-0123456789abcdef0123456789abcdef';
/** An admin of one named client, not of every client (`"*"`). */
const NARROW_ADMIN_KEY = 'narrow-admin-key-0123456789abcdef0123456789ab';
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const fingerprintOf = (token: string) => sha(token).slice(0, 16);
const GRANTS = [
  { name: 'oncall', sha256: sha(ADMIN_KEY), clients: ['*'], scopes: ['admin'] },
  { name: 'checkout', sha256: sha(CALLER_KEY), clients: [FLEET_CLIENT] },
  {
    name: 'other-oncall',
    sha256: sha(NARROW_ADMIN_KEY),
    clients: [FLEET_CLIENT],
    scopes: ['admin'],
  },
];

interface Replica {
  broker: StackBroker;
  adminUrl: string;
  proxy: FaultProxy;
}

/** One answer of `GET /token` seen by the poller. */
interface Served {
  replica: number;
  sentAt: number;
  status: number;
  fingerprint?: string;
}

describe('admin routes (3 replicas)', () => {
  let set: Stack;
  let emulator: ProviderEmulator;
  let replicas: Replica[];
  let inspect: Redis;
  const proxies: FaultProxy[] = [];
  let files: { credentials: string; keys: string };

  beforeAll(async () => {
    // Caller grants in a file of their own (CALLER_API_KEYS_FILE), not inline in the config:
    // `POST /admin/reload` re-reads that file.
    set = await startStack({
      name: 'admin',
      admin: true,
      replicas: 0,
      redis: 'standalone',
      clients: [{ id: FLEET_CLIENT, credentials: FLEET_CREDENTIALS }],
      callerAuth: { mode: 'api-key' },
      env: { LOG_LEVEL: 'info', REDIS_PING_INTERVAL_MS: '200', REDIS_COMMAND_TIMEOUT_MS: '300' },
    });
    emulator = set.provider;
    const config = JSON.parse(readFileSync(set.configFile, 'utf8')) as {
      clients: Array<{ credentials: { file: string } }>;
    };
    files = { credentials: config.clients[0].credentials.file, keys: join(set.dir, 'keys.json') };
    writeFileSync(files.keys, JSON.stringify(GRANTS));
    const redis = set.redis as RedisTopology;
    const [host, port] = redis.nodes[0].split(':');
    replicas = await Promise.all(
      [0, 1, 2].map(async (i) => {
        const proxy = await FaultProxy.start({ target: { host, port: Number(port) } });
        proxies.push(proxy);
        const broker = await set.addBroker({
          name: `broker-${i}`,
          env: { REDIS_URL: proxy.url('redis'), CALLER_API_KEYS_FILE: files.keys },
        });
        return { broker, proxy, adminUrl: broker.adminUrl! };
      }),
    );
    inspect = redis.client() as Redis;
  });

  afterAll(async () => {
    await set?.close();
    await Promise.all(proxies.map((p) => p.close()));
  });

  const admin = (r: Replica, path: string, method = 'GET', key = ADMIN_KEY) =>
    fetch(`${r.adminUrl}${path}`, { method, headers: { authorization: `Bearer ${key}` } });

  /** The fingerprint a replica serves now (GET /token), or the status when it serves none. */
  async function served(r: Replica): Promise<{ status: number; fingerprint?: string }> {
    const res = await fetch(`${r.broker.url}/token`, {
      headers: { authorization: `Bearer ${CALLER_KEY}` },
    });
    if (res.status !== 200) {
      await res.arrayBuffer();
      return { status: res.status };
    }
    const body = (await res.json()) as { access_token: string };
    return { status: 200, fingerprint: fingerprintOf(body.access_token) };
  }

  /** Audit lines of `action` a replica wrote so far. */
  const auditLines = (r: Replica, action: string) =>
    r.broker
      .logs()
      .filter((l) => l.includes('"audit":"admin"') && l.includes(`"action":"${action}"`))
      .map((l) => JSON.parse(l.slice(l.indexOf('{'))) as Record<string, unknown>);

  it('serves /admin/* and /metrics on the admin port only, /health/* on both, to scope admin only, auditing every call', async () => {
    const [r] = replicas;
    // The API port: no admin routes, no metrics; the probes stay.
    for (const path of ['/admin/clients', '/metrics']) {
      const res = await fetch(`${r.broker.url}${path}`, {
        headers: { authorization: `Bearer ${ADMIN_KEY}` },
      });
      expect(res.status).toBe(404);
      expect(res.headers.get('content-type')).toContain('application/problem+json');
      await res.arrayBuffer();
    }
    // Readiness on the API port: its status only, no clients, expiries or errors.
    const ready = await fetch(`${r.broker.url}/health/ready`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ok' });
    // The admin port: probes (readiness with its report), metrics and admin routes, not the API.
    const report = await fetch(`${r.adminUrl}/health/ready`);
    expect(report.status).toBe(200);
    expect(await report.json()).toMatchObject({ status: 'ok', details: { tokens: {}, store: {} } });
    expect((await fetch(`${r.adminUrl}/health/live`)).status).toBe(200);
    const metrics = await fetch(`${r.adminUrl}/metrics`);
    expect(metrics.status).toBe(200);
    expect(await metrics.text()).toContain('token_broker_');
    const api = await fetch(`${r.adminUrl}/token`, {
      headers: { authorization: `Bearer ${CALLER_KEY}` },
    });
    expect(api.status).toBe(404);
    await api.arrayBuffer();

    // No credential: 401; a caller without scope admin: 403; both problem+json and audited.
    const anonymous = await fetch(`${r.adminUrl}/admin/clients`);
    expect(anonymous.status).toBe(401);
    expect(((await anonymous.json()) as { code: string }).code).toBe('unauthenticated');
    const merchant = await admin(r, `/admin/clients/${FLEET_CLIENT}/revoke`, 'POST', CALLER_KEY);
    expect(merchant.status).toBe(403);
    expect(((await merchant.json()) as { detail: string }).detail).toContain('scope "admin"');
    const unknown = await admin(r, '/admin/clients/no-such-client/refresh', 'POST');
    expect(unknown.status).toBe(404);
    await unknown.arrayBuffer();

    const status = await admin(r, '/admin/clients');
    expect(status.status).toBe(200);
    expect(status.headers.get('cache-control')).toBe('no-store');
    const text = await status.text();
    const body = JSON.parse(text) as {
      store: { kind: string; mode: string; state: string; nodes: string[] };
      clients: Array<{ client: string; fingerprint: string; generation: number; lock: unknown }>;
    };
    expect(body.store).toMatchObject({ kind: 'redis', mode: 'standalone', state: 'up' });
    expect(body.clients).toHaveLength(1);
    expect(body.clients[0]).toMatchObject({ client: FLEET_CLIENT, generation: 0 });
    const now = await served(r);
    expect(body.clients[0].fingerprint).toBe(now.fingerprint);
    // Fingerprints only: the token itself is nowhere in the answer.
    const token = (await (
      await fetch(`${r.broker.url}/token`, { headers: { authorization: `Bearer ${CALLER_KEY}` } })
    ).json()) as { access_token: string };
    expect(text).not.toContain(token.access_token);

    await waitFor(
      () => auditLines(r, 'status').length >= 2 && auditLines(r, 'revoke').length >= 1,
      {
        timeoutMs: 5000,
        what: 'the audit lines of the admin calls',
      },
    );
    const outcomes = [...auditLines(r, 'status'), ...auditLines(r, 'revoke')].map((l) => ({
      caller: l.caller,
      outcome: l.outcome,
      client: l.client,
      reason: l.reason,
    }));
    expect(outcomes).toEqual(
      expect.arrayContaining([
        { caller: undefined, outcome: 'unauthenticated', client: undefined, reason: undefined },
        {
          caller: 'checkout',
          outcome: 'forbidden',
          client: undefined,
          reason: 'missing_scope_admin',
        },
        { caller: 'oncall', outcome: 'ok', client: undefined, reason: undefined },
      ]),
    );
    for (const line of auditLines(r, 'status')) expect(typeof line.requestId).toBe('string');
    // A revoke the caller was refused changed nothing.
    expect(await inspect.get(`tb:{${FLEET_CLIENT}}:gen`)).toBeNull();
  });

  it('forces one refresh for the whole fleet, even asked on every replica at once, adopted everywhere within a second', async () => {
    // The fleet's token must be older than the coalescing slack (FORCED_COALESCE_MS).
    await delay(200);
    const before = emulator.stats.tokenRequests;
    const old = (await served(replicas[0])).fingerprint;
    const answers = await Promise.all(
      [...replicas, ...replicas].map(async (r) => {
        const res = await admin(r, `/admin/clients/${FLEET_CLIENT}/refresh`, 'POST');
        expect(res.status).toBe(200);
        return {
          at: Date.now(),
          ...((await res.json()) as { fingerprint: string; providerRequest: boolean }),
        };
      }),
    );
    const fresh = answers[0].fingerprint;
    expect(fresh).not.toBe(old);
    expect(new Set(answers.map((a) => a.fingerprint))).toEqual(new Set([fresh]));
    expect(answers.filter((a) => a.providerRequest)).toHaveLength(1);
    const answeredAt = Math.max(...answers.map((a) => a.at));
    const adoptedIn = await Promise.all(
      replicas.map(async (r) => {
        await waitFor(async () => (await served(r)).fingerprint === fresh, {
          timeoutMs: 1000,
          intervalMs: 10,
          what: `${r.broker.name} to serve the forced token`,
        });
        return Date.now() - answeredAt;
      }),
    );
    expect(emulator.stats.tokenRequests).toBe(before + 1);
    process.stdout.write(
      `forced refresh: 6 concurrent requests on 3 replicas, ${emulator.stats.tokenRequests - before} provider request, every replica serving it ${Math.max(0, ...adoptedIn)} ms after the last answer\n`,
    );
  });

  it('names the answering replica and its own last refresh: fetched by a forced refresh here, adopted elsewhere', async () => {
    interface Status {
      replica: string;
      clients: Array<{
        client: string;
        fingerprint?: string;
        lastRefresh?: { at: string; outcome: string; forced?: boolean };
      }>;
    }
    const statusOf = async (r: Replica) => {
      const res = await admin(r, '/admin/clients');
      expect(res.status).toBe(200);
      const body = (await res.json()) as Status;
      return { replica: body.replica, ...body.clients.find((c) => c.client === FLEET_CLIENT)! };
    };
    // Each forced refresh on another replica; the token must be older than the coalescing slack.
    for (const on of [1, 2]) {
      await delay(200);
      const askedAt = Date.now();
      const res = await admin(replicas[on], `/admin/clients/${FLEET_CLIENT}/refresh`, 'POST');
      const forced = (await res.json()) as { fingerprint: string; providerRequest: boolean };
      expect(forced.providerRequest).toBe(true);
      const views = await Promise.all(
        replicas.map((r) =>
          waitFor(
            async () => {
              const s = await statusOf(r);
              return s.fingerprint === forced.fingerprint ? s : undefined;
            },
            { timeoutMs: 2000, intervalMs: 20, what: `${r.broker.name} to hold the forced token` },
          ),
        ),
      );
      // Every replica names itself, the way lock holders are named: host (pod) and pid.
      expect(views.map((v) => v.replica)).toEqual(
        replicas.map((r) => `${hostname()}:${r.broker.process!.pid}`),
      );
      views.forEach((v, i) => {
        expect(Date.parse(v.lastRefresh!.at)).toBeGreaterThanOrEqual(askedAt);
        expect([i, v.lastRefresh!.outcome, v.lastRefresh!.forced]).toEqual(
          i === on ? [i, 'fetched', true] : [i, 'adopted', undefined],
        );
      });
    }
  });

  it('revokes fleet-wide while one replica is cut off from Redis: nobody serves the old token after it hears of it, the cut-off one never writes it back', async () => {
    const before = emulator.stats.tokenRequests;
    const old = (await served(replicas[0])).fingerprint!;
    for (const r of replicas) expect((await served(r)).fingerprint).toBe(old);

    // Every replica polled throughout, each answer recorded with the time it was sent.
    const seen: Served[] = [];
    let polling = true;
    const pollers = replicas.map(async (r, replica) => {
      const deadline = Date.now() + 60_000;
      while (polling && Date.now() < deadline) {
        const sentAt = Date.now();
        seen.push({ replica, sentAt, ...(await served(r).catch(() => ({ status: 0 }))) });
        await delay(5);
      }
    });
    try {
      // Partition replica 2: its connections are cut and every reconnection refused.
      const cut = replicas[2];
      cut.proxy.refuse();
      cut.proxy.cut();
      await waitFor(
        async () =>
          ((await (await admin(cut, '/admin/clients')).json()) as { store: { state: string } })
            .store.state === 'down',
        { timeoutMs: 5000, what: 'replica 2 to see Redis down' },
      );

      // The replacement lives shorter than the revoked token: a replica that merely adopted the
      // later-expiring token on reconnection would keep the old one.
      emulator.setKnobs({ tokenLifetimeSeconds: 1200 });
      const revokeSentAt = Date.now();
      const res = await admin(replicas[0], `/admin/clients/${FLEET_CLIENT}/revoke`, 'POST');
      const revokedAt = Date.now();
      expect(res.status).toBe(200);
      const answer = (await res.json()) as {
        generation: number;
        revokedFingerprint: string;
        replicas: { notified: number; acknowledged: number };
      };
      expect(answer).toMatchObject({
        generation: 1,
        revokedFingerprint: old,
        replicas: { notified: 2, acknowledged: 2 },
      });
      // The connected replicas get one new token between them.
      const [fresh] = await Promise.all(
        [0, 1].map((i) =>
          waitFor(
            async () => {
              const now = (await served(replicas[i])).fingerprint;
              return now !== undefined && now !== old ? now : undefined;
            },
            { timeoutMs: 5000, what: `replica ${i} to serve a new token` },
          ),
        ),
      );
      // Meanwhile the cut-off replica cannot hear it and still serves what it holds.
      await delay(500);
      const stillOld = seen.filter(
        (s) => s.replica === 2 && s.fingerprint === old && s.sentAt > revokedAt,
      );
      expect(stillOld.length).toBeGreaterThan(0);

      // Heal: replica 2 reconnects, learns the generation, drops the old token.
      const healedAt = Date.now();
      cut.proxy.pass();
      const backAt = await waitFor(
        async () => {
          const s = (await (await admin(cut, '/admin/clients')).json()) as {
            store: { state: string };
          };
          return s.store.state === 'up' ? Date.now() : undefined;
        },
        { timeoutMs: 10_000, intervalMs: 10, what: 'replica 2 to see Redis again' },
      );
      await waitFor(async () => (await served(cut)).fingerprint === fresh, {
        timeoutMs: 3000,
        what: 'replica 2 to serve the new token',
      });
      await delay(1500);
      polling = false;
      await Promise.all(pollers);

      const oldAfter = (replica: number, t: number) =>
        seen.filter((s) => s.replica === replica && s.fingerprint === old && s.sentAt >= t);
      // The connected replicas: not one answer with the old token sent after the revoke answered.
      expect(oldAfter(0, revokedAt)).toEqual([]);
      expect(oldAfter(1, revokedAt)).toEqual([]);
      // The cut-off one: none sent once it saw Redis again.
      expect(oldAfter(2, backAt)).toEqual([]);
      const lastOld = (replica: number) =>
        Math.max(
          ...seen
            .filter((s) => s.replica === replica && s.fingerprint === old)
            .map((s) => s.sentAt),
        );
      // Never written back: Redis holds the new token; one provider request for the fleet.
      expect(await inspect.hget(`tb:{${FLEET_CLIENT}}:token`, 'fp')).toBe(fresh);
      expect(await inspect.get(`tb:{${FLEET_CLIENT}}:gen`)).toBe('1');
      expect(emulator.stats.tokenRequests).toBe(before + 1);
      // It acknowledged the revoke once back.
      expect(await inspect.scard(`tb:{${FLEET_CLIENT}}:acks:1`)).toBe(3);
      expect(seen.filter((s) => s.status !== 200 && s.status !== 503)).toEqual([]);
      process.stdout.write(
        `revoke under partition: ${seen.length} calls checked (${seen.filter((s) => s.fingerprint === old).length} with the old token, all before each replica knew); ` +
          `revoke answered in ${revokedAt - revokeSentAt} ms (notified ${answer.replicas.notified}, acknowledged ${answer.replicas.acknowledged}); ` +
          `last old answer on the connected replicas ${Math.max(lastOld(0), lastOld(1)) - revokeSentAt} ms after the revoke was sent; ` +
          `cut-off replica: Redis seen again ${backAt - healedAt} ms after the heal, last old answer sent ${lastOld(2) - healedAt} ms after the heal; ` +
          `${emulator.stats.tokenRequests - before} new token from the provider\n`,
      );
    } finally {
      polling = false;
      await Promise.all(pollers);
    }
  });

  it('refuses the fleet-wide reload to an admin granted one client, naming no other client', async () => {
    const [r] = replicas;
    const before = replicas.map((x) => x.broker.logs().length);
    const res = await admin(r, '/admin/reload', 'POST', NARROW_ADMIN_KEY);
    expect(res.status).toBe(403);
    const text = await res.text();
    const problem = JSON.parse(text) as { code: string; detail: string };
    expect(problem.code).toBe('forbidden');
    expect(problem.detail).toContain('every client ("*")');
    expect(text).not.toContain(FLEET_CLIENT);
    await waitFor(() => auditLines(r, 'reload').some((l) => l.caller === 'other-oncall'), {
      timeoutMs: 5000,
      what: 'the audit line of the refused reload',
    });
    expect(auditLines(r, 'reload').find((l) => l.caller === 'other-oncall')).toMatchObject({
      outcome: 'forbidden',
      reason: 'fleet_wide_needs_every_client',
    });
    // Nothing reloaded, here or elsewhere (a reload's answer would name the clients it read).
    for (const [i, x] of replicas.entries()) {
      expect(x.broker.logs().slice(before[i]).join('\n')).not.toContain('reloaded credentials');
    }
  });

  it('reloads credentials and caller grants now, fleet-wide, naming what changed: the rotation after a leak', async () => {
    /** Each other replica's log line for the fleet reload asked after `before` (log lengths). */
    const fleetReloadLines = (asker: number, before: number[]) =>
      Promise.all(
        replicas.map((r, i) =>
          i === asker
            ? Promise.resolve(undefined)
            : waitFor(
                () =>
                  r.broker
                    .logs()
                    .slice(before[i])
                    .filter((l) => l.startsWith('{'))
                    .map((l) => JSON.parse(l) as Record<string, unknown>)
                    .find((l) =>
                      String(l.msg).startsWith('reloaded credentials and caller grants'),
                    ),
                { timeoutMs: 5000, what: `${r.broker.name} reloading at the fleet request` },
              ),
        ),
      );
    const beforeFirst = replicas.map((r) => r.broker.logs().length);
    const unchanged = await admin(replicas[1], '/admin/reload', 'POST');
    expect(unchanged.status).toBe(200);
    const first = (await unchanged.json()) as {
      credentials: { changed: string[]; firstRead: string[]; failed: string[] };
    };
    expect(first).toMatchObject({
      credentials: { changed: [], failed: [] },
      callers: { added: [], removed: [] },
    });
    // The others reloaded too (before anything is rotated: their answer must not see it).
    for (const line of await fleetReloadLines(1, beforeFirst)) {
      if (line) expect(line).toMatchObject({ callers: { added: [], removed: [] } });
    }
    // The secret is rotated at the provider and in the secret store; a new caller is granted.
    const rotated = { ...FLEET_CREDENTIALS, client_secret: 'rotated-secret-value' };
    emulator.setCredentials({ [rotated.client_id]: rotated.client_secret });
    writeFileSync(files.credentials, JSON.stringify(rotated), { mode: 0o600 });
    const newcomer = 'newcomer-key-0123456789abcdef0123456789abcdef';
    writeFileSync(
      files.keys,
      JSON.stringify([...GRANTS, { name: 'newcomer', sha256: sha(newcomer), clients: ['*'] }]),
    );
    // Asked on one replica, the reload reaches the whole fleet through Redis.
    const logsBefore = replicas.map((r) => r.broker.logs().length);
    const res0 = await admin(replicas[0], '/admin/reload', 'POST');
    expect(res0.status).toBe(200);
    const text = await res0.text();
    const body = JSON.parse(text) as {
      credentials: { changed: string[]; firstRead: string[]; failed: string[] };
    };
    // A replica that only ever adopted the fleet's tokens had never read the credentials:
    // it says so (firstRead) rather than "changed".
    expect([...body.credentials.changed, ...body.credentials.firstRead]).toEqual([FLEET_CLIENT]);
    expect(body).toMatchObject({
      credentials: { failed: [] },
      callers: { added: ['newcomer'], removed: [] },
      replicas: { notified: replicas.length },
    });
    // Names only.
    expect(text).not.toContain(rotated.client_secret);
    const changed = [...body.credentials.changed];
    const lines = await fleetReloadLines(0, logsBefore);
    for (const [i, r] of replicas.entries()) {
      const line = lines[i];
      if (!line) continue;
      const credentials = line.clients as { changed: string[]; firstRead: string[] };
      expect([...credentials.changed, ...credentials.firstRead]).toEqual([FLEET_CLIENT]);
      expect(line).toMatchObject({ callers: { added: ['newcomer'], removed: [] } });
      changed.push(...credentials.changed);
      // The newcomer's key works there without anyone calling that replica's admin route.
      const token = await fetch(`${r.broker.url}/token`, {
        headers: { authorization: `Bearer ${newcomer}` },
      });
      expect(token.status).toBe(200);
      await token.arrayBuffer();
    }
    // At least the replica that obtained the first token had read them: it saw the change.
    expect(changed.length).toBeGreaterThan(0);
    // The fleet gets a token with the new secret at once; the newcomer may use it.
    const refreshed = await admin(replicas[2], `/admin/clients/${FLEET_CLIENT}/refresh`, 'POST');
    expect(refreshed.status).toBe(200);
    expect(((await refreshed.json()) as { providerRequest: boolean }).providerRequest).toBe(true);
    const res = await fetch(`${replicas[0].broker.url}/token`, {
      headers: { authorization: `Bearer ${newcomer}` },
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    for (const r of replicas) {
      expect(r.broker.logs().join('\n')).not.toContain(rotated.client_secret);
    }
  });
});
