import { Cluster } from 'ioredis';
import { ManagedProcess, minimalEnv } from '../managed-process';
import { waitFor } from '../wait';
import { adminCommand, hostPort, info, RedisNode, SETTLE_TIMEOUT_MS, track } from './node';
import type { RedisTopology, Switch, TopologySettings } from './topology';

/** Cluster node timeout: how long a master may be unreachable before its replica takes over. */
const CLUSTER_NODE_TIMEOUT_MS = 1000;

/**
 * A Redis Cluster of three masters with one replica each, created by
 * `redis-cli --cluster create` as an operator would.
 */
export class RedisCluster implements RedisTopology {
  readonly kind = 'cluster';
  readonly url = undefined;
  private readonly clients: Cluster[] = [];

  private constructor(
    /** The six nodes, dead ones included. */
    readonly servers: RedisNode[],
  ) {}

  /** Every node's address, dead ones included: the seeds clients are configured with. */
  get nodes(): readonly string[] {
    return this.servers.map((s) => s.address);
  }

  /**
   * Starts three masters with `replicasPerMaster` replicas each, creates the cluster and
   * resolves once every node reports it healthy.
   */
  static async start(replicasPerMaster = 1): Promise<RedisCluster> {
    const cluster = new RedisCluster([]);
    try {
      cluster.servers.push(
        ...(await Promise.all(
          Array.from({ length: 3 * (1 + replicasPerMaster) }, (_, i) =>
            RedisNode.start(
              (_port, busPort) => [
                '--cluster-enabled',
                'yes',
                '--cluster-node-timeout',
                String(CLUSTER_NODE_TIMEOUT_MS),
                // The default bus port (port + 10000) may be taken or beyond 65535.
                '--cluster-port',
                String(busPort),
                // A replica may take over however long ago it last synced: the data is tiny,
                // and a replica whose first sync is not done yet must still be promotable.
                '--cluster-replica-validity-factor',
                '0',
              ],
              { name: `redis-server:cluster-${i}` },
            ),
          ),
        )),
      );
      const create = ManagedProcess.start({
        name: 'redis-cli --cluster create',
        command: 'redis-cli',
        args: [
          '--cluster',
          'create',
          ...cluster.nodes,
          '--cluster-replicas',
          String(replicasPerMaster),
          '--cluster-yes',
        ],
        env: minimalEnv(),
      });
      const created = await create.exited;
      if (created.code !== 0) {
        throw new Error(
          `redis-cli --cluster create failed: ${create.describeExit()}\n${create.tail()}`,
        );
      }
      await cluster.waitSettled(replicasPerMaster > 0);
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
    await node.stop();
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
    await Promise.all(this.servers.map((s) => s.stop()));
  }

  private liveNode(): RedisNode {
    const node = this.servers.find((s) => s.isRunning());
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
        for (const s of this.servers.filter((n) => n.isRunning())) {
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
        for (const s of this.servers.filter((n) => n.isRunning())) {
          const i = await info(s.address, 'cluster');
          if (i.cluster_state !== 'ok' || i.cluster_slots_ok !== '16384') return false;
          const view = await clusterNodes(s.address);
          // Every node has met every other over the bus: a PUBLISH reaches the subscribers of
          // every node only then.
          const live = this.servers.filter((n) => n.isRunning()).map((n) => n.address);
          if (live.some((a) => !view.some((n) => n.address === a))) return false;
          const linked = (n: ClusterNode) => n.flags.includes('myself') || n.link === 'connected';
          if (view.some((n) => live.includes(n.address) && !linked(n))) return false;
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
          for (const s of this.servers.filter((n) => n.isRunning())) {
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

/** Starts a cluster of three masters, each with one replica unless told otherwise. */
export function startRedisCluster(replicasPerMaster = 1): Promise<RedisCluster> {
  return RedisCluster.start(replicasPerMaster);
}

/** One line of `CLUSTER NODES`. */
interface ClusterNode {
  id: string;
  /** `host:port` (without the bus port). */
  address: string;
  flags: string[];
  /** The master's id for a replica, `-` for a master. */
  masterId: string;
  /** `connected` or `disconnected`: this node's bus link to that one. */
  link: string;
  /** Slot ranges, e.g. `0-5460`; a single slot stays a single number. */
  slots: string[];
}

async function clusterNodes(address: string): Promise<ClusterNode[]> {
  const text = String(await adminCommand(address, 'CLUSTER', 'NODES'));
  return text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => {
      const [id, addr, flags, masterId, , , , link, ...slots] = line.split(' ');
      return {
        id,
        address: addr.split('@')[0],
        flags: flags.split(','),
        masterId,
        link,
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
