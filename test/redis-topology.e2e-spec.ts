import { Redis } from 'ioredis';
import { RedisCluster, startRedisCluster } from './support/redis/cluster';
import { adminCommand } from './support/redis/node';
import { SentinelGroup, startSentinelGroup } from './support/redis/sentinel';
import { FixedEndpointPair, startFixedEndpointPair } from './support/redis/standalone';
import { startTopology } from './support/redis/topology';
import { waitFor } from './support/wait';

/** Whether anything still answers PING at `host:port`. */
async function answers(address: string): Promise<boolean> {
  return adminCommand(address, 'PING').then(
    (reply) => reply === 'PONG',
    () => false,
  );
}

function hostPort(address: string): { host: string; port: number } {
  const [host, port] = address.split(':');
  return { host, port: Number(port) };
}

/** Retries `op` until it succeeds: a client needs a moment to follow a failover. */
async function eventually<T>(op: () => Promise<T>, what: string): Promise<T> {
  return waitFor(async () => ({ value: await op() }), { timeoutMs: 30_000, what }).then(
    (r) => r.value,
  );
}

describe(FixedEndpointPair.name, () => {
  let pair: FixedEndpointPair;

  beforeAll(async () => {
    pair = await startFixedEndpointPair();
  });

  afterAll(async () => {
    await pair?.stop();
  });

  it('describes itself as a standalone Redis at the endpoint', () => {
    expect(pair.kind).toBe('standalone');
    expect(pair.url).toBe(`redis://127.0.0.1:${pair.proxy.port}`);
    expect(pair.nodes).toEqual([`127.0.0.1:${pair.proxy.port}`]);
    expect(pair.env()).toEqual({ REDIS_MODE: 'standalone', REDIS_URL: pair.url });
    expect(pair.settings()).toEqual({ mode: 'standalone', url: pair.url });
  });

  it('demote(): open connections get READONLY from the old master, new ones reach the new one', async () => {
    const before = pair.client();
    await before.set('kept', 'yes');
    const switched = await pair.demote();
    expect(switched.from).not.toBe(switched.to);
    expect(pair.master).toBe(switched.to);

    // The connection opened before the failover is still open, to the demoted node.
    await expect(before.set('k', 'v')).rejects.toThrow(/READONLY/);
    expect(await before.get('kept')).toBe('yes');

    const after = pair.client();
    expect(await after.set('k', 'v')).toBe('OK');
    expect(await after.get('kept')).toBe('yes');

    // And back: the pair can fail over again.
    const again = await pair.demote();
    expect(again).toEqual({ from: switched.to, to: switched.from });
    await expect(after.set('k', 'v2')).rejects.toThrow(/READONLY/);
    expect(await pair.client().set('k', 'v3')).toBe('OK');

    await pair.flush();
    expect(await pair.client().dbsize()).toBe(0);
  });

  it('detachReplica(): the next demote() promotes the replica without the writes it missed', async () => {
    const c = pair.client();
    await c.set('before', '1');
    expect(await c.wait(1, 5000)).toBe(1);
    await pair.detachReplica();
    await c.set('missed', '1');
    await pair.demote();
    const after = pair.client();
    expect(await after.get('before')).toBe('1');
    expect(await after.get('missed')).toBeNull();
    // The old master copied the new one: the pair is whole again and can fail over normally.
    expect(await after.set('k', 'v')).toBe('OK');
    expect(await after.wait(1, 5000)).toBe(1);
    await pair.demote();
    expect(await pair.client().get('k')).toBe('v');
  });
});

describe(SentinelGroup.name, () => {
  let group: SentinelGroup;

  beforeAll(async () => {
    group = await startSentinelGroup();
  });

  afterAll(async () => {
    await group?.stop();
  });

  it('gives the sentinels to clients in the config shape and as broker env', () => {
    expect(group.kind).toBe('sentinel');
    expect(group.url).toBeUndefined();
    expect(group.nodes).toHaveLength(3);
    expect(group.settings()).toEqual({
      mode: 'sentinel',
      sentinel: { nodes: [...group.nodes], masterName: group.masterName },
    });
    expect(group.env()).toEqual({
      REDIS_MODE: 'sentinel',
      REDIS_SENTINELS: group.nodes.join(','),
      REDIS_SENTINEL_MASTER: group.masterName,
    });
  });

  it('failover() and killMaster() promote a replica that has the data; a Sentinel client follows', async () => {
    const client = group.client();
    await client.set('kept', 'yes');
    // Replication is asynchronous: a failover right after a write may lose it (as in
    // production); this test is about the helper, so it waits for both replicas first.
    expect(await client.wait(2, 5000)).toBe(2);
    const first = await group.masterAddress();

    const switched = await group.failover();
    expect(switched.from).toBe(first);
    expect(switched.to).not.toBe(first);
    expect(await group.masterAddress()).toBe(switched.to);
    expect(await eventually(() => client.set('after-failover', '1'), 'a write')).toBe('OK');
    expect(await client.get('kept')).toBe('yes');
    expect(await client.wait(2, 5000)).toBe(2);

    const killed = await group.killMaster();
    expect(killed.from).toBe(switched.to);
    expect(killed.to).not.toBe(killed.from);
    expect(await answers(killed.from)).toBe(false);
    expect(await eventually(() => client.set('after-kill', '1'), 'a write')).toBe('OK');
    expect(await client.get('after-failover')).toBe('1');

    await group.flush();
    expect(await client.dbsize()).toBe(0);
  }, 260_000);
});

describe(RedisCluster.name, () => {
  let cluster: RedisCluster;

  beforeAll(async () => {
    cluster = await startRedisCluster();
  });

  afterAll(async () => {
    await cluster?.stop();
  });

  it('has six nodes in the config shape and as broker env', () => {
    expect(cluster.kind).toBe('cluster');
    expect(cluster.nodes).toHaveLength(6);
    expect(cluster.settings()).toEqual({ mode: 'cluster', cluster: { nodes: [...cluster.nodes] } });
    expect(cluster.env()).toEqual({
      REDIS_MODE: 'cluster',
      REDIS_CLUSTER_NODES: cluster.nodes.join(','),
    });
  });

  it('spreads keys over three masters; flush() empties every one', async () => {
    const client = cluster.client();
    const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
    for (const k of keys) await client.set(k, k);
    const owners = new Set(await Promise.all(keys.map((k) => cluster.masterOf(k))));
    expect(owners.size).toBe(3);
    await cluster.flush();
    const left = await Promise.all(client.nodes('master').map((n) => n.dbsize()));
    expect(left).toEqual([0, 0, 0]);
  });

  it('failoverSlotOf() and killMasterOf() move the key to its replica; a Cluster client follows', async () => {
    const client = cluster.client();
    await client.set('moving', 'yes');
    const switched = await cluster.failoverSlotOf('moving');
    expect(switched.from).not.toBe(switched.to);
    expect(await cluster.masterOf('moving')).toBe(switched.to);
    expect(await eventually(() => client.set('moving', 'still'), 'a write')).toBe('OK');
    // Asynchronous replication: wait until the replica has the write before killing its master.
    const replica = new Redis({ ...hostPort(switched.from), lazyConnect: true });
    try {
      await replica.connect();
      await replica.readonly();
      await waitFor(async () => (await replica.get('moving')) === 'still', {
        timeoutMs: 5000,
        what: 'the replica to have the write',
      });
    } finally {
      replica.disconnect();
    }

    const killed = await cluster.killMasterOf('moving');
    expect(killed.from).toBe(switched.to);
    expect(killed.to).toBe(switched.from);
    expect(await answers(killed.from)).toBe(false);
    expect(await cluster.masterOf('moving')).toBe(killed.to);
    expect(await eventually(() => client.get('moving'), 'a read')).toBe('still');
  });
});

describe(startTopology.name, () => {
  it('stop() leaves no process behind', async () => {
    const cluster = await startTopology('cluster');
    const group = await startTopology('sentinel');
    const addresses = [...cluster.nodes, ...group.nodes];
    expect(await Promise.all(addresses.map(answers))).toEqual(addresses.map(() => true));
    await Promise.all([cluster.stop(), group.stop()]);
    expect(await Promise.all(addresses.map(answers))).toEqual(addresses.map(() => false));
  });
});
