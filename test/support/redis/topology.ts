import type { Cluster, Redis } from 'ioredis';
import { RedisCluster } from './cluster';
import { SentinelGroup } from './sentinel';
import { StandaloneRedis, startRedis } from './standalone';

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
 * in `afterAll`: every process it started is gone once that resolves.
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
