import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import { FaultProxy } from './fault-proxy';
import { ManagedProcess, minimalEnv, REDIS_PRIORITY } from './managed-process';
import { freePort } from './ports';
import { ping, startRedis, type TestRedis } from './redis-server';
import { waitFor } from './wait';

/** The Redis deployments the broker supports, in the order suites run them. */
export const TOPOLOGY_KINDS = ['standalone', 'sentinel', 'cluster'] as const;
export type TopologyKind = (typeof TOPOLOGY_KINDS)[number];

/**
 * The part of the broker's `redis` settings that says where Redis is, in the shape of the
 * config schema (`redis.mode` and its block). Spread it into `redisSettingsSchema.parse()`.
 */
export type TopologySettings =
  | { mode: 'standalone'; url: string }
  | { mode: 'sentinel'; sentinel: { nodes: string[]; masterName: string } }
  | { mode: 'cluster'; cluster: { nodes: string[] } };

/** What a failover did: the master before and after, as `host:port`. */
export interface Switch {
  from: string;
  to: string;
}

/**
 * A Redis deployment for one test file, whatever its topology. Obtain one with
 * {@link startTopology} (or the `start*` function of a kind) and call {@link RedisTopology.stop}
 * in `afterAll`: every process it started is gone once that resolves (and if the test runner
 * dies first, the exit hook of `managed-process` kills them).
 */
export interface RedisTopology {
  readonly kind: TopologyKind;
  /** Addresses (`host:port`) clients start from: the server, the sentinels or the cluster seeds. */
  readonly nodes: readonly string[];
  /** `redis://host:port` of the one endpoint of a standalone Redis; `undefined` otherwise. */
  readonly url: string | undefined;
  /** Environment for a broker process (`REDIS_MODE` and the variables of that mode). */
  env(): Record<string, string>;
  /** Where Redis is, in the shape of the broker's `redis` settings. */
  settings(): TopologySettings;
  /**
   * A plain ioredis client for assertions (`Cluster` for a cluster, a Sentinel-aware `Redis`
   * for a Sentinel group), disconnected by {@link RedisTopology.stop}.
   */
  client(): Redis | Cluster;
  /** Deletes every key on every master. */
  flush(): Promise<void>;
  /** Disconnects the clients it gave out and stops every process it started. */
  stop(): Promise<void>;
}

/**
 * Starts a Redis of the given kind. Standalone follows {@link startRedis} (`REDIS_URL`, a
 * container, or a local process); Sentinel and Cluster are always local processes, because
 * their members must reach each other at the addresses clients are given, which a container
 * per node behind port mappings does not provide without host networking.
 */
export async function startTopology(kind: TopologyKind): Promise<RedisTopology> {
  switch (kind) {
    case 'standalone':
      return new StandaloneRedis(await startRedis());
    case 'sentinel':
      return SentinelGroup.start();
    case 'cluster':
      return RedisCluster.start();
  }
}

/** Timing of the Sentinel group: short, so a failover takes a second or two instead of 30 s. */
const SENTINEL_DOWN_AFTER_MS = 1000;
const SENTINEL_FAILOVER_TIMEOUT_MS = 3000;
/** Cluster node timeout: how long a master may be unreachable before its replica takes over. */
const CLUSTER_NODE_TIMEOUT_MS = 1000;
/**
 * Deadline for a topology to form, and for a failover to complete. Usually seconds; generous
 * because a sentinel whose timer is starved for over 2 s (a busy machine) enters TILT mode and
 * does nothing for 30 s, which stretched a crash's settling past a minute in CI.
 */
const SETTLE_TIMEOUT_MS = 120_000;
const STOP_GRACE_MS = 2000;
const HOST = '127.0.0.1';

/** A key whose writes prove a node is a master; deleted, never set, so no data is left. */
const PROBE_KEY = 'redis-topology:probe';

/** A standalone Redis: one endpoint, the broker's default mode. */
export class StandaloneRedis implements RedisTopology {
  readonly kind = 'standalone';
  readonly url: string;
  readonly nodes: readonly string[];
  private readonly clients: Redis[] = [];

  constructor(readonly redis: TestRedis) {
    this.url = redis.url;
    this.nodes = [`${redis.host}:${redis.port}`];
  }

  env(): Record<string, string> {
    return { REDIS_MODE: 'standalone', REDIS_URL: this.url };
  }

  settings(): TopologySettings {
    return { mode: 'standalone', url: this.url };
  }

  client(): Redis {
    return track(this.clients, new Redis(this.url, { maxRetriesPerRequest: 1 }));
  }

  async flush(): Promise<void> {
    await this.redis.flush();
  }

  async stop(): Promise<void> {
    for (const c of this.clients.splice(0)) c.disconnect();
    await this.redis.stop();
  }
}

/**
 * A standalone endpoint with two Redis nodes behind it, like ElastiCache's primary endpoint:
 * the endpoint is a TCP forwarder ({@link FaultProxy}) that clients reach at {@link url}, and
 * the other node replicates the master so that {@link FixedEndpointPair.demote} can swap them.
 */
export class FixedEndpointPair implements RedisTopology {
  readonly kind = 'standalone';
  readonly url: string;
  readonly nodes: readonly string[];
  private masterIndex: 0 | 1 = 0;
  /** Whether {@link FixedEndpointPair.detachReplica} cut the replica off. */
  private detached = false;
  private readonly clients: Redis[] = [];

  private constructor(
    private readonly dir: string,
    private readonly servers: [RedisNode, RedisNode],
    /** The endpoint; exposed for faults beyond a failover (`cut()`, `blackhole()`). */
    readonly proxy: FaultProxy,
  ) {
    this.url = proxy.url('redis');
    this.nodes = [`${proxy.host}:${proxy.port}`];
  }

  /** Starts node A (master), node B (its replica) and the endpoint, pointing at A. */
  static async start(): Promise<FixedEndpointPair> {
    const dir = mkdtempSync(join(tmpdir(), 'tb-pair-'));
    let a: RedisNode | undefined;
    let b: RedisNode | undefined;
    try {
      a = await spawnRedisNode('redis-server:pair-a', dir, []);
      b = await spawnRedisNode('redis-server:pair-b', dir, ['--replicaof', HOST, String(a.port)]);
      await waitForReplicaLink(b);
      const proxy = await FaultProxy.start({ target: { host: HOST, port: a.port } });
      return new FixedEndpointPair(dir, [a, b], proxy);
    } catch (err) {
      await a?.proc.kill('SIGKILL');
      await b?.proc.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** `host:port` of the node that is master now (the endpoint's target). */
  get master(): string {
    return this.servers[this.masterIndex].address;
  }

  /**
   * Fails over the way a managed primary endpoint does: the replica becomes master (after
   * catching up, via Redis's coordinated `FAILOVER`), the old master becomes its replica, and
   * the endpoint sends *new* connections to the new master. Open connections stay with the old
   * master, which now answers every write with `READONLY`: a client must notice that itself.
   *
   * After {@link FixedEndpointPair.detachReplica}, the replica is promoted as it is, without
   * catching up: whatever the master took since is lost, like a failover to a lagging replica.
   */
  async demote(): Promise<Switch> {
    const old = this.servers[this.masterIndex];
    const next = this.servers[this.masterIndex === 0 ? 1 : 0];
    if (this.detached) {
      // The replica is a master already; the old master now copies its (older) data set.
      await adminCommand(old.address, 'REPLICAOF', HOST, next.port);
      this.detached = false;
    } else {
      // FAILOVER refuses a target the master does not list as online yet (a replica's link is
      // up a moment before the master finishes the sync on its side).
      await waitFor(
        async () => (await info(old.address, 'replication')).slave0?.includes('state=online'),
        { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 20, what: `${next.address} to be online` },
      );
      await adminCommand(old.address, 'FAILOVER', 'TO', HOST, next.port, 'TIMEOUT', 5000);
    }
    await waitFor(
      async () => {
        const oldInfo = await info(old.address, 'replication');
        return (
          oldInfo.role === 'slave' &&
          oldInfo.master_failover_state === 'no-failover' &&
          (await acceptsWrites(next.address))
        );
      },
      { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 50, what: `${next.address} to take over` },
    );
    this.proxy.retarget({ host: HOST, port: next.port });
    this.masterIndex = this.masterIndex === 0 ? 1 : 0;
    // Ready for the next demote(): the new replica must be in sync to be promoted in turn.
    await waitForReplicaLink(old);
    return { from: old.address, to: next.address };
  }

  /**
   * Stops the replica from replicating, keeping the data it has (`REPLICAOF NO ONE` on it;
   * clients never reach it while the endpoint points at the master). Every write from now on
   * is missing from it, so the next {@link FixedEndpointPair.demote} loses them: the lock, a
   * token or an idempotency record written in between.
   */
  async detachReplica(): Promise<void> {
    const replica = this.servers[this.masterIndex === 0 ? 1 : 0];
    await adminCommand(replica.address, 'REPLICAOF', 'NO', 'ONE');
    this.detached = true;
  }

  env(): Record<string, string> {
    return { REDIS_MODE: 'standalone', REDIS_URL: this.url };
  }

  settings(): TopologySettings {
    return { mode: 'standalone', url: this.url };
  }

  client(): Redis {
    return track(this.clients, new Redis(this.url, { maxRetriesPerRequest: 1 }));
  }

  async flush(): Promise<void> {
    await adminCommand(this.master, 'FLUSHALL');
  }

  async stop(): Promise<void> {
    for (const c of this.clients.splice(0)) c.disconnect();
    await this.proxy.close();
    await Promise.all(this.servers.map((n) => n.proc.stop(STOP_GRACE_MS)));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A Sentinel group: one master, two replicas and three `redis-sentinel` processes (quorum 2)
 * that fail over after {@link SENTINEL_DOWN_AFTER_MS} without an answer.
 */
export class SentinelGroup implements RedisTopology {
  readonly kind = 'sentinel';
  readonly url = undefined;
  readonly masterName = 'broker-master';
  private readonly clients: Redis[] = [];

  private constructor(
    private readonly dir: string,
    private readonly servers: RedisNode[],
    private readonly sentinels: RedisNode[],
  ) {}

  /** The sentinels' addresses: what clients are configured with. */
  get nodes(): readonly string[] {
    return this.sentinels.map((s) => s.address);
  }

  /** Starts the group and resolves once every sentinel knows the master, replicas and peers. */
  static async start(): Promise<SentinelGroup> {
    const dir = mkdtempSync(join(tmpdir(), 'tb-sentinel-'));
    const servers: RedisNode[] = [];
    const sentinels: RedisNode[] = [];
    const group = new SentinelGroup(dir, servers, sentinels);
    try {
      const master = await spawnRedisNode('redis-server:sentinel-master', dir, []);
      servers.push(master);
      const replicaArgs = ['--replicaof', HOST, String(master.port)];
      servers.push(
        ...(await Promise.all(
          [1, 2].map((i) => spawnRedisNode(`redis-server:sentinel-replica-${i}`, dir, replicaArgs)),
        )),
      );
      await Promise.all(servers.slice(1).map(waitForReplicaLink));
      // The sentinels learn the replicas from the master's INFO as soon as they connect, so
      // start them only once the replicas are attached. They would find each other through
      // hello messages every 2 s; being told their peers up front saves seconds per start.
      const peers = await Promise.all(
        [0, 1, 2].map(async () => ({
          port: await freePort(),
          id: randomBytes(20).toString('hex'),
        })),
      );
      sentinels.push(
        ...(await Promise.all(
          peers.map((me, i) =>
            spawnSentinel(`redis-sentinel-${i}`, dir, group.masterName, master, me, peers),
          ),
        )),
      );
      await group.waitSettled(master.address);
      return group;
    } catch (err) {
      await group.stop();
      throw err;
    }
  }

  /** `host:port` of the master, as the first sentinel reports it. */
  async masterAddress(): Promise<string> {
    return sentinelMaster(this.sentinels[0].address, this.masterName);
  }

  /**
   * `SENTINEL FAILOVER`: promotes a replica without the master failing. Resolves once every
   * sentinel reports the new master, it accepts writes, and the old master replicates it (a
   * sentinel converts it when it next looks at it: up to about 10 s after the switch).
   */
  async failover(): Promise<Switch> {
    const from = await this.masterAddress();
    await adminCommand(this.sentinels[0].address, 'SENTINEL', 'FAILOVER', this.masterName);
    return { from, to: await this.waitForSwitch(from) };
  }

  /**
   * Kills the master (SIGKILL, like a crashed node) and resolves once the sentinels have
   * promoted a replica that accepts writes. The old master stays down.
   */
  async killMaster(): Promise<Switch> {
    const from = await this.masterAddress();
    const node = this.servers.find((s) => s.address === from);
    if (!node) throw new Error(`the master ${from} is not one of this group's servers`);
    await node.proc.kill('SIGKILL');
    return { from, to: await this.waitForSwitch(from) };
  }

  env(): Record<string, string> {
    return {
      REDIS_MODE: 'sentinel',
      REDIS_SENTINELS: this.nodes.join(','),
      REDIS_SENTINEL_MASTER: this.masterName,
    };
  }

  settings(): TopologySettings {
    return { mode: 'sentinel', sentinel: { nodes: [...this.nodes], masterName: this.masterName } };
  }

  client(): Redis {
    return track(
      this.clients,
      new Redis({
        sentinels: this.nodes.map(hostPort),
        name: this.masterName,
        maxRetriesPerRequest: 1,
        // As the broker does: a node demoted under the connection answers READONLY; reconnect
        // (asking the sentinels again) rather than keep writing to a replica.
        reconnectOnError: (err) => (err.message.startsWith('READONLY') ? 2 : false),
      }),
    );
  }

  async flush(): Promise<void> {
    await adminCommand(await this.masterAddress(), 'FLUSHALL');
  }

  async stop(): Promise<void> {
    for (const c of this.clients.splice(0)) c.disconnect();
    // Sentinels first: they must not react to the servers going away.
    await Promise.all(this.sentinels.map((s) => s.proc.stop(STOP_GRACE_MS)));
    await Promise.all(this.servers.map((s) => s.proc.stop(STOP_GRACE_MS)));
    rmSync(this.dir, { recursive: true, force: true });
  }

  private async waitForSwitch(from: string): Promise<string> {
    const to = await waitFor(
      async () => {
        const seen = await Promise.all(
          this.sentinels.map((s) => sentinelMaster(s.address, this.masterName)),
        );
        return seen.every((a) => a === seen[0]) && seen[0] !== from ? seen[0] : null;
      },
      { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 50, what: `the sentinels to replace ${from}` },
    );
    await this.waitSettled(to);
    return to;
  }

  /**
   * Waits until `master` accepts writes, every live server replicates it, and every sentinel
   * agrees on it, sees a healthy replica and its two peers, and has no failover in progress
   * (a `SENTINEL FAILOVER` during one is refused).
   */
  private async waitSettled(master: string): Promise<void> {
    const live = this.servers.filter((s) => s.proc.isRunning() && s.address !== master);
    const started = Date.now();
    const nudged = new Set<string>();
    let unmet = 'nothing checked yet';
    await waitFor(
      async () => {
        if (!(await acceptsWrites(master))) {
          const role = await info(master, 'replication').catch(() => undefined);
          unmet = `${master} does not accept writes (role ${role?.role ?? 'unknown'}, of ${role?.master_host}:${role?.master_port})`;
          // The sentinels name it master but it still replicates (a promotion the leader did
          // not see through): after 15 s the harness completes it, as an operator would.
          if (role?.role === 'slave' && Date.now() - started > 15_000 && !nudged.has(master)) {
            nudged.add(master);
            await adminCommand(master, 'REPLICAOF', 'NO', 'ONE');
          }
          return false;
        }
        // Every live server must follow the new master before the next failover: the old
        // master is converted only once a sentinel's periodic INFO (every 10 s) finds it
        // still claiming to be master, and until then it takes writes the new master never
        // sees. Promoting it next would lose them.
        for (const r of live) {
          const i = await info(r.address, 'replication');
          if (i.role !== 'slave' || `${i.master_host}:${i.master_port}` !== master) {
            unmet = `${r.address} is ${i.role} of ${i.master_host}:${i.master_port}, not of ${master}`;
            // A sentinel reconfigures a stray server eventually; one starved into TILT mode
            // (30 s of doing nothing) or past its failover timeout can take over a minute.
            // After 15 s the harness does what the sentinel would, as an operator would.
            if (Date.now() - started > 15_000 && !nudged.has(r.address)) {
              nudged.add(r.address);
              const [host, port] = master.split(':');
              await adminCommand(r.address, 'REPLICAOF', host, port);
            }
            return false;
          }
          if (i.master_link_status !== 'up') {
            unmet = `${r.address}'s link to ${master} is ${i.master_link_status}`;
            return false;
          }
        }
        for (const s of this.sentinels) {
          const m = fields(await adminCommand(s.address, 'SENTINEL', 'MASTER', this.masterName));
          if (`${m.ip}:${m.port}` !== master || m.flags !== 'master') {
            unmet = `sentinel ${s.address} sees ${m.ip}:${m.port} flagged ${m.flags}`;
            return false;
          }
          if (Number(m['num-other-sentinels']) !== this.sentinels.length - 1) {
            unmet = `sentinel ${s.address} knows ${m['num-other-sentinels']} other sentinels`;
            return false;
          }
          const replicas = (
            (await adminCommand(s.address, 'SENTINEL', 'REPLICAS', this.masterName)) as unknown[]
          ).map(fields);
          if (live.length > 0 && !replicas.some((r) => r.flags === 'slave')) {
            unmet = `sentinel ${s.address} sees no healthy replica (${replicas.map((r) => `${r.ip}:${r.port} ${r.flags}`).join(', ')})`;
            return false;
          }
        }
        return true;
      },
      {
        timeoutMs: SETTLE_TIMEOUT_MS,
        intervalMs: 100,
        what: `the Sentinel group to settle on ${master}`,
      },
    ).catch((err: unknown) => {
      throw new Error(
        `${err instanceof Error ? err.message : String(err)}; still unmet: ${unmet}`,
        { cause: err },
      );
    });
  }
}

/**
 * A Redis Cluster of three masters with one replica each, created by
 * `redis-cli --cluster create` as an operator would.
 */
export class RedisCluster implements RedisTopology {
  readonly kind = 'cluster';
  readonly url = undefined;
  private readonly clients: Cluster[] = [];

  private constructor(
    private readonly dir: string,
    private readonly servers: RedisNode[],
  ) {}

  /** Every node's address, dead ones included: the seeds clients are configured with. */
  get nodes(): readonly string[] {
    return this.servers.map((s) => s.address);
  }

  /** Starts six nodes, creates the cluster and resolves once every node reports it healthy. */
  static async start(): Promise<RedisCluster> {
    const dir = mkdtempSync(join(tmpdir(), 'tb-cluster-'));
    const servers: RedisNode[] = [];
    const cluster = new RedisCluster(dir, servers);
    try {
      servers.push(
        ...(await Promise.all(
          Array.from({ length: 6 }, (_, i) =>
            spawnRedisNode(`redis-server:cluster-${i}`, dir, (port, busPort) => [
              '--cluster-enabled',
              'yes',
              '--cluster-config-file',
              join(dir, `nodes-${port}.conf`),
              '--cluster-node-timeout',
              String(CLUSTER_NODE_TIMEOUT_MS),
              // The default bus port (port + 10000) may be taken or beyond 65535.
              '--cluster-port',
              String(busPort),
            ]),
          ),
        )),
      );
      const create = ManagedProcess.start({
        name: 'redis-cli --cluster create',
        command: 'redis-cli',
        args: ['--cluster', 'create', ...cluster.nodes, '--cluster-replicas', '1', '--cluster-yes'],
        env: minimalEnv(),
        cwd: dir,
      });
      const created = await create.exited;
      if (created.code !== 0) {
        throw new Error(
          `redis-cli --cluster create failed: ${create.describeExit()}\n${create.tail()}`,
        );
      }
      await cluster.waitSettled(true);
      return cluster;
    } catch (err) {
      await cluster.stop();
      throw err;
    }
  }

  /**
   * `CLUSTER FAILOVER` on the replica of the master that owns `key`'s slot: a manual failover,
   * the master alive. Resolves once every node sees the replica own the slot and the old master
   * replicates it.
   */
  async failoverSlotOf(key: string): Promise<Switch> {
    const { master, replica } = await this.shardOf(key);
    await adminCommand(replica.address, 'CLUSTER', 'FAILOVER');
    await this.waitOwner(key, replica.address, true);
    return { from: master.address, to: replica.address };
  }

  /**
   * Kills the master that owns `key`'s slot (SIGKILL) and resolves once its replica has taken
   * over (after the node timeout) in every live node's view. The old master stays down.
   */
  async killMasterOf(key: string): Promise<Switch> {
    const { master, replica } = await this.shardOf(key);
    const node = this.servers.find((s) => s.address === master.address);
    if (!node) throw new Error(`the master ${master.address} is not one of this cluster's nodes`);
    await node.proc.kill('SIGKILL');
    await this.waitOwner(key, replica.address, false);
    return { from: master.address, to: replica.address };
  }

  /** `host:port` of the master that owns `key`'s slot now. */
  async masterOf(key: string): Promise<string> {
    return (await this.ownerOf(key)).address;
  }

  env(): Record<string, string> {
    return { REDIS_MODE: 'cluster', REDIS_CLUSTER_NODES: this.nodes.join(',') };
  }

  settings(): TopologySettings {
    return { mode: 'cluster', cluster: { nodes: [...this.nodes] } };
  }

  client(): Cluster {
    return track(
      this.clients,
      new Cluster(this.nodes.map(hostPort), { redisOptions: { maxRetriesPerRequest: 1 } }),
    );
  }

  async flush(): Promise<void> {
    const view = await clusterNodes(this.liveNode().address);
    const masters = view.filter((n) => n.flags.includes('master') && !isFailing(n));
    await Promise.all(masters.map((m) => adminCommand(m.address, 'FLUSHALL')));
  }

  async stop(): Promise<void> {
    for (const c of this.clients.splice(0)) c.disconnect();
    await Promise.all(this.servers.map((s) => s.proc.stop(STOP_GRACE_MS)));
    rmSync(this.dir, { recursive: true, force: true });
  }

  private liveNode(): RedisNode {
    const node = this.servers.find((s) => s.proc.isRunning());
    if (!node) throw new Error('every node of the cluster is down');
    return node;
  }

  private async ownerOf(key: string): Promise<ClusterNode> {
    const at = this.liveNode().address;
    const slot = Number(await adminCommand(at, 'CLUSTER', 'KEYSLOT', key));
    const master = (await clusterNodes(at)).find(
      (n) => n.flags.includes('master') && owns(n, slot),
    );
    if (!master) throw new Error(`no node of ${at}'s view owns slot ${slot}`);
    return master;
  }

  private async shardOf(key: string): Promise<{ master: ClusterNode; replica: ClusterNode }> {
    const master = await this.ownerOf(key);
    const view = await clusterNodes(this.liveNode().address);
    const replica = view.find((n) => n.masterId === master.id && !isFailing(n));
    if (!replica) throw new Error(`the master ${master.address} has no live replica`);
    return { master, replica };
  }

  /** Waits until every live node sees `owner` as the master of `key`'s slot, writable. */
  private async waitOwner(key: string, owner: string, withReplicas: boolean): Promise<void> {
    const slot = Number(await adminCommand(owner, 'CLUSTER', 'KEYSLOT', key));
    await waitFor(
      async () => {
        for (const s of this.servers.filter((n) => n.proc.isRunning())) {
          const view = await clusterNodes(s.address);
          const master = view.find((n) => n.flags.includes('master') && owns(n, slot));
          if (master?.address !== owner) return false;
        }
        return (await info(owner, 'replication')).role === 'master';
      },
      { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 50, what: `${owner} to own slot ${slot}` },
    );
    await this.waitSettled(withReplicas);
  }

  /**
   * Waits until every live node reports `cluster_state:ok` with all slots served by live
   * masters, and all nodes agree on who owns what. With `withReplicas`, also until every
   * master has an attached replica (a later failover needs one).
   */
  private async waitSettled(withReplicas: boolean): Promise<void> {
    await waitFor(
      async () => {
        let agreed: string | undefined;
        for (const s of this.servers.filter((n) => n.proc.isRunning())) {
          const i = await clusterInfo(s.address);
          if (i.cluster_state !== 'ok' || i.cluster_slots_ok !== '16384') return false;
          const view = await clusterNodes(s.address);
          const masters = view.filter((n) => n.flags.includes('master') && n.slots.length > 0);
          if (masters.length !== 3 || masters.some(isFailing)) return false;
          if (
            withReplicas &&
            masters.some((m) => !view.some((n) => n.masterId === m.id && !isFailing(n)))
          ) {
            return false;
          }
          const owners = masters
            .map((m) => `${m.address}=${m.slots.join(',')}`)
            .sort()
            .join(' ');
          if (agreed !== undefined && owners !== agreed) return false;
          agreed = owners;
        }
        if (withReplicas) {
          // Replicas also need their replication link up, or CLUSTER FAILOVER waits for it.
          for (const s of this.servers.filter((n) => n.proc.isRunning())) {
            const r = await info(s.address, 'replication');
            if (r.role === 'slave' && r.master_link_status !== 'up') return false;
          }
        }
        return true;
      },
      { timeoutMs: SETTLE_TIMEOUT_MS, intervalMs: 100, what: 'the cluster to settle' },
    );
  }
}

/** Starts a standalone pair behind a fixed endpoint. */
export function startFixedEndpointPair(): Promise<FixedEndpointPair> {
  return FixedEndpointPair.start();
}

/** Starts a Sentinel group. */
export function startSentinelGroup(): Promise<SentinelGroup> {
  return SentinelGroup.start();
}

/** Starts a three-master, three-replica cluster. */
export function startRedisCluster(): Promise<RedisCluster> {
  return RedisCluster.start();
}

/** A `redis-server` or `redis-sentinel` process this module started. */
interface RedisNode {
  readonly port: number;
  /** `127.0.0.1:<port>`. */
  readonly address: string;
  readonly proc: ManagedProcess;
}

/** No RDB, no AOF: nothing survives a restart and nothing is written to disk. */
const NO_PERSISTENCE = ['--save', '', '--appendonly', 'no'];

/**
 * Starts `redis-server` on a free loopback port (and a second free port for extra use, e.g.
 * the cluster bus), without persistence, and resolves once it answers PING. Retries on a port
 * taken between choosing and binding it.
 */
async function spawnRedisNode(
  name: string,
  dir: string,
  extraArgs: readonly string[] | ((port: number, busPort: number) => string[]),
): Promise<RedisNode> {
  return spawnOnFreePort(name, 'redis-server', (port, busPort) => [
    '--port',
    String(port),
    '--bind',
    HOST,
    ...NO_PERSISTENCE,
    // A master waits 5 s by default for more replicas to share a full sync with: every
    // replica attach (start, failover) would take that long.
    '--repl-diskless-sync-delay',
    '0',
    // A replica stores each full sync as an RDB file even without persistence, and every
    // redis-server loads the one it finds on start: a directory of the topology's own keeps
    // one test's data from turning up in another's Redis.
    '--dir',
    dir,
    '--dbfilename',
    `dump-${port}.rdb`,
    '--protected-mode',
    'no',
    ...(typeof extraArgs === 'function' ? extraArgs(port, busPort) : extraArgs),
  ]);
}

/**
 * Starts a `redis-sentinel` monitoring `master`. Sentinel rewrites its configuration file as
 * it learns the topology, so each one gets a writable file of its own in `dir`.
 */
async function spawnSentinel(
  name: string,
  dir: string,
  masterName: string,
  master: RedisNode,
  me: SentinelPeer,
  peers: readonly SentinelPeer[],
): Promise<RedisNode> {
  const file = join(dir, `sentinel-${me.port}.conf`);
  writeFileSync(
    file,
    [
      `port ${me.port}`,
      `bind ${HOST}`,
      'protected-mode no',
      `dir ${dir}`,
      `sentinel myid ${me.id}`,
      `sentinel monitor ${masterName} ${HOST} ${master.port} 2`,
      `sentinel down-after-milliseconds ${masterName} ${SENTINEL_DOWN_AFTER_MS}`,
      `sentinel failover-timeout ${masterName} ${SENTINEL_FAILOVER_TIMEOUT_MS}`,
      `sentinel parallel-syncs ${masterName} 2`,
      ...peers
        .filter((p) => p !== me)
        .map((p) => `sentinel known-sentinel ${masterName} ${HOST} ${p.port} ${p.id}`),
      '',
    ].join('\n'),
  );
  // The peers' configurations name this port: no retry on another one.
  return spawnOnFreePort(name, 'redis-sentinel', () => [file], me.port);
}

/** A sentinel's port and run id, chosen before it starts so its peers can be told. */
interface SentinelPeer {
  port: number;
  id: string;
}

async function spawnOnFreePort(
  name: string,
  command: string,
  args: (port: number, busPort: number) => string[],
  fixedPort?: number,
): Promise<RedisNode> {
  for (let attempt = 1; ; attempt++) {
    const [port, busPort] = await Promise.all([fixedPort ?? freePort(), freePort()]);
    if (port === busPort) continue;
    const proc = ManagedProcess.start({
      name: `${name}:${port}`,
      command,
      args: args(port, busPort),
      env: minimalEnv(),
      // Redis resolves relative files against its working directory: keep them out of the repo.
      cwd: tmpdir(),
      priority: REDIS_PRIORITY,
      realtime: command === 'redis-sentinel',
    });
    const exited = new AbortController();
    void proc.exited.then(() => exited.abort(new Error(proc.describeExit())));
    try {
      await waitFor(() => ping(HOST, port), {
        timeoutMs: 10_000,
        intervalMs: 10,
        what: `${name} on port ${port} to answer PING`,
        signal: exited.signal,
      });
      return { port, address: `${HOST}:${port}`, proc };
    } catch (err) {
      await proc.kill('SIGKILL');
      const logs = proc.tail();
      if (/address already in use/i.test(logs) && attempt < 3 && fixedPort === undefined) continue;
      if (proc.exitStatus?.error && 'code' in proc.exitStatus.error) {
        if (proc.exitStatus.error.code === 'ENOENT') {
          throw new Error(
            `${command} is not on PATH: install it (apt-get install ${command}; .ci/run does)`,
            { cause: proc.exitStatus.error },
          );
        }
      }
      throw new Error(`${name} on port ${port} did not start: ${errorMessage(err)}\n${logs}`, {
        cause: err,
      });
    }
  }
}

/**
 * One command on one node over a short-lived connection without retries: the helpers poll
 * nodes that may be down, and must neither hang nor leave a reconnecting client behind.
 */
async function adminCommand(address: string, ...args: Array<string | number>): Promise<unknown> {
  const client = new Redis({
    ...hostPort(address),
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 1000,
    commandTimeout: 2000,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    const [command, ...rest] = args;
    return await client.call(String(command), ...rest.map(String));
  } finally {
    client.disconnect();
  }
}

/** `INFO <section>` as a record of its `field:value` lines. */
async function info(address: string, section: string): Promise<Record<string, string>> {
  return colonFields(String(await adminCommand(address, 'INFO', section)));
}

/** `CLUSTER INFO` as a record. */
async function clusterInfo(address: string): Promise<Record<string, string>> {
  return colonFields(String(await adminCommand(address, 'CLUSTER', 'INFO')));
}

function colonFields(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split(/\r?\n/)) {
    const at = line.indexOf(':');
    if (at > 0 && !line.startsWith('#')) out[line.slice(0, at)] = line.slice(at + 1);
  }
  return out;
}

/** Whether `address` takes a write now (a DEL of a key that never exists: no data changes). */
async function acceptsWrites(address: string): Promise<boolean> {
  try {
    await adminCommand(address, 'DEL', PROBE_KEY);
    return true;
  } catch {
    return false;
  }
}

async function waitForReplicaLink(node: RedisNode): Promise<void> {
  await waitFor(async () => (await info(node.address, 'replication')).master_link_status === 'up', {
    timeoutMs: SETTLE_TIMEOUT_MS,
    intervalMs: 50,
    what: `${node.address} to sync with its master`,
  });
}

/** The master address a sentinel reports for `name`. */
async function sentinelMaster(sentinel: string, name: string): Promise<string> {
  const reply = (await adminCommand(sentinel, 'SENTINEL', 'GET-MASTER-ADDR-BY-NAME', name)) as
    | [string, string]
    | null;
  if (!reply) throw new Error(`sentinel ${sentinel} does not know ${name}`);
  return `${reply[0]}:${reply[1]}`;
}

/** A flat `[key, value, key, value, ...]` reply (SENTINEL MASTER) as a record. */
function fields(reply: unknown): Record<string, string> {
  const list = reply as string[];
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < list.length; i += 2) out[list[i]] = list[i + 1];
  return out;
}

/** One line of `CLUSTER NODES`. */
interface ClusterNode {
  id: string;
  /** `host:port` (without the bus port). */
  address: string;
  flags: string[];
  /** The master's id for a replica, `-` for a master. */
  masterId: string;
  /** Slot ranges, e.g. `0-5460`; a single slot stays a single number. */
  slots: string[];
}

async function clusterNodes(address: string): Promise<ClusterNode[]> {
  const text = String(await adminCommand(address, 'CLUSTER', 'NODES'));
  return text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => {
      const [id, addr, flags, masterId, , , , , ...slots] = line.split(' ');
      return {
        id,
        address: addr.split('@')[0],
        flags: flags.split(','),
        masterId,
        // Slots being migrated (`[1234->-id]`) are not owned yet.
        slots: slots.filter((s) => !s.startsWith('[')),
      };
    });
}

function isFailing(node: ClusterNode): boolean {
  return node.flags.some(
    (f) => f === 'fail' || f === 'fail?' || f === 'handshake' || f === 'noaddr',
  );
}

function owns(node: ClusterNode, slot: number): boolean {
  return node.slots.some((range) => {
    const [from, to = from] = range.split('-').map(Number);
    return slot >= from && slot <= to;
  });
}

function hostPort(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(':');
  return { host: address.slice(0, at), port: Number(address.slice(at + 1)) };
}

function track<T extends Redis | Cluster>(list: T[], client: T): T {
  // Failovers make clients see errors; the assertions look at command results, not events.
  client.on('error', () => undefined);
  list.push(client);
  return client;
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
