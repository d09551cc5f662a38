import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { freePort } from '../ports';
import { waitFor } from '../wait';
import {
  acceptsWrites,
  adminCommand,
  errorMessage,
  HOST,
  hostPort,
  info,
  RedisNode,
  SETTLE_TIMEOUT_MS,
  track,
  waitForReplicaLink,
} from './node';
import type { RedisTopology, Switch, TopologySettings } from './topology';

/** Timing of the Sentinel group: short, so a failover takes a second or two instead of 30 s. */
const SENTINEL_DOWN_AFTER_MS = 1000;
const SENTINEL_FAILOVER_TIMEOUT_MS = 3000;

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
    /** The `redis-server` nodes, the first master first, dead ones included. */
    readonly servers: RedisNode[],
    readonly sentinels: RedisNode[],
  ) {}

  /** The sentinels' addresses: what clients are configured with. */
  get nodes(): readonly string[] {
    return this.sentinels.map((s) => s.address);
  }

  /** Starts the group and resolves once every sentinel knows the master, replicas and peers. */
  static async start(): Promise<SentinelGroup> {
    const group = new SentinelGroup([], []);
    try {
      const master = await RedisNode.start([], { name: 'redis-server:sentinel-master' });
      group.servers.push(master);
      const replicaArgs = ['--replicaof', HOST, String(master.port)];
      group.servers.push(
        ...(await Promise.all(
          [1, 2].map((i) =>
            RedisNode.start(replicaArgs, { name: `redis-server:sentinel-replica-${i}` }),
          ),
        )),
      );
      await Promise.all(group.servers.slice(1).map((r) => waitForReplicaLink(r.address)));
      // The sentinels learn the replicas from the master's INFO as soon as they connect, so
      // start them only once the replicas are attached. They would find each other through
      // hello messages every 2 s; being told their peers up front saves seconds per start.
      const peers = await Promise.all(
        [0, 1, 2].map(async () => ({
          port: await freePort(),
          id: randomBytes(20).toString('hex'),
        })),
      );
      const name = group.masterName;
      group.sentinels.push(
        ...(await Promise.all(
          peers.map((me, i) =>
            RedisNode.start(
              [
                `sentinel myid ${me.id}`,
                `sentinel monitor ${name} ${HOST} ${master.port} 2`,
                `sentinel down-after-milliseconds ${name} ${SENTINEL_DOWN_AFTER_MS}`,
                `sentinel failover-timeout ${name} ${SENTINEL_FAILOVER_TIMEOUT_MS}`,
                `sentinel parallel-syncs ${name} 2`,
                ...peers
                  .filter((p) => p !== me)
                  .map((p) => `sentinel known-sentinel ${name} ${HOST} ${p.port} ${p.id}`),
              ],
              // The peers' configurations name this port: no retry on another one.
              { name: `redis-sentinel-${i}`, sentinel: true, port: me.port },
            ),
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
    await node.stop();
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
    await Promise.all(this.sentinels.map((s) => s.stop()));
    await Promise.all(this.servers.map((s) => s.stop()));
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
    const live = this.servers.filter((s) => s.isRunning() && s.address !== master);
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
      throw new Error(`${errorMessage(err)}; still unmet: ${unmet}`, { cause: err });
    });
  }
}

/** Starts a Sentinel group. */
export function startSentinelGroup(): Promise<SentinelGroup> {
  return SentinelGroup.start();
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
