import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import type { RedisSettings } from '../config/config.schema';
import type { StoreContinuity, StoreHealth, StoreTopology } from '../token/token-store';
import { TokenStoreErrorCode, TokenStoreException } from '../token/token-store.exception';
import { RedisClockOffset } from './redis-clock';
import { closeRedisClient, type RedisClient, takeEarlyError } from './redis.connection';
import { redisKeys } from './redis.constants';
import { RedisStateTracker, type StateLogger } from './redis-state';
import { defineTokenStoreScripts, type RedisWithScripts } from './token-store.lua';

/** As `retryDelayOnFailover`. */
const RESUBSCRIBE_DELAY_MS = 100;
const RESYNC_INTERVAL_MS = 1000;

const SILENT: StateLogger = {
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
};

/**
 * Owns both connections and the subscription. The store's other parts send every command through
 * {@link run}, so each outcome counts.
 */
export class RedisStoreHealth implements StoreHealth {
  readonly kind = 'redis' as const;
  readonly redis: RedisWithScripts;
  /** Only durations taken on it reach Redis, so an offset cancels out; tests replace it. */
  now: () => number = Date.now;
  readonly clock = new RedisClockOffset();
  private readonly recoveredListeners: Array<() => void> = [];
  private readonly epochs = new Map<string, { id: string; seq: number }>();
  private readonly tracker: RedisStateTracker;
  private readonly pingTimer: NodeJS.Timeout;
  private closing = false;
  /** Settles once Redis confirmed the subscription, or refused it. */
  private readonly subscribed: Promise<unknown>;
  private resubscribing = false;
  private nodeLeft = false;

  /**
   * @param probeClient whose keys the health probe touches (an ACL grants per client).
   * @param channels what `subscriber` subscribes to, and keeps subscribed.
   */
  constructor(
    redis: RedisClient,
    private readonly subscriber: RedisClient,
    private readonly settings: RedisSettings,
    private readonly probeClient: string,
    private channels: string[],
    logger: StateLogger = SILENT,
  ) {
    const nodes = redisNodes(settings);
    this.tracker = new RedisStateTracker(logger, nodes.described, nodes.setting);
    this.redis = defineTokenStoreScripts(redis);
    // Connection errors carry the real cause that failing commands lack; an unhandled 'error'
    // event would also crash the process.
    const onConnectionError = (err: unknown) => this.tracker.failed(err, true);
    for (const client of [redis, subscriber]) {
      client.on('error', onConnectionError);
      client.on('node error', onConnectionError);
      const early = takeEarlyError(client);
      if (early !== undefined) onConnectionError(early);
    }
    // Every reconnection is a recovery, even a blip shorter than the ping interval: Redis may
    // have restarted empty and the replicas must push their token back. READONLY closes it too.
    redis.on('close', () => {
      if (!this.closing) this.tracker.failed(new Error('connection to Redis closed'));
    });
    redis.on('ready', () => void this.ping());
    // A resubscribed subscriber missed what was published meanwhile: re-read, as after an outage.
    let subscribedBefore = false;
    subscriber.on('ready', () => {
      if (subscribedBefore) this.recovered();
      subscribedBefore = true;
    });
    this.pingTimer = setInterval(() => void this.ping(), settings.pingIntervalMs);
    this.pingTimer.unref();
    this.subscribed = subscriber.subscribe(...channels).catch(() => undefined);
    // A Cluster moves its subscriber off a dead or departed node without telling either client:
    // a node leaving is the only sign. Watched once subscribed, as nodes also leave at start-up.
    void this.subscribed.then(() => {
      for (const client of [redis, subscriber]) {
        client.on('-node', () => void this.resubscribe());
      }
    });
  }

  get healthy(): boolean {
    return this.tracker.state === 'up';
  }

  /** A setting to fix (authentication, ACL, TLS trust), not an outage to wait out. */
  get configurationError(): string | undefined {
    return this.tracker.problem?.message;
  }

  onRecovered(listener: () => void): void {
    this.recoveredListeners.push(listener);
  }

  topology(): StoreTopology {
    const { nodes } = redisNodes(this.settings);
    return { kind: 'redis', mode: this.settings.mode, nodes, state: this.tracker.state };
  }

  /**
   * One marker per Redis node, not per client: every client's keys on a node share its fate, so
   * one client whose slot the node serves stands for the others there, with its own `epoch` key
   * (which replicas of earlier versions advance too). A standalone or Sentinel Redis is one node:
   * one command a round, whatever the number of clients; a Cluster, one per master.
   */
  async checkContinuity(clientIds: readonly string[]): Promise<Map<string, StoreContinuity>> {
    const found = new Map<string, StoreContinuity>();
    await Promise.all(
      [...this.byNode(clientIds).values()].map(async (ids) => {
        const continuity = await this.advanceEpoch(ids[0]);
        for (const id of ids) found.set(id, continuity);
      }),
    );
    return found;
  }

  /**
   * Clients by the node that serves their keys (all of a client's keys share its hash tag, so its
   * slot); one group without a Cluster or its slot map.
   */
  byNode(clientIds: readonly string[]): Map<string, string[]> {
    const groups = new Map<string, string[]>();
    const slots = this.redis.isCluster ? (this.redis as Cluster).slots : undefined;
    for (const id of clientIds) {
      const node = slots?.[calculateSlot(redisKeys.epoch(id))]?.[0] ?? '';
      const group = groups.get(node);
      if (group) group.push(id);
      else groups.set(node, [id]);
    }
    return groups;
  }

  private async advanceEpoch(clientId: string): Promise<StoreContinuity> {
    const sentAt = this.now();
    const [id, seq, redisNow] = await this.run((redis) =>
      redis.tbEpochAdvance(redisKeys.epoch(clientId), randomUUID()),
    );
    this.clock.observe(sentAt, this.now(), Number(redisNow));
    const seen = this.epochs.get(clientId);
    this.epochs.set(clientId, { id, seq: Number(seq) });
    if (seen === undefined) return 'first';
    if (seen.id !== id) return 'lost';
    return Number(seq) > seen.seq ? 'kept' : 'rolled_back';
  }

  /**
   * Also waits, within `timeoutMs`, for the subscription: the token managers read the store once
   * this returns, and an event published after that read must reach this replica. A Cluster
   * client may resend its SUBSCRIBE after it is ready, when it moves off a seed node.
   */
  async waitUntilReady(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      await this.ping();
      if (this.healthy) break;
      // A configuration error will not pass within the wait: start now, not ready.
      if (this.tracker.state === 'misconfigured') return false;
      await sleep(50);
    }
    if (!this.healthy) return false;
    await Promise.race([this.subscribed, sleep(deadline - Date.now(), undefined, { ref: false })]);
    return true;
  }

  /**
   * Re-reads once the subscription is confirmed again, so that the re-read and the subscription
   * leave nothing between them; then at most once per {@link RESYNC_INTERVAL_MS} while nodes
   * keep leaving: a dead node that commands re-add to the pool leaves again at each one, until
   * the cluster fails it over.
   */
  private async resubscribe(): Promise<void> {
    this.nodeLeft = true;
    if (this.resubscribing) return;
    this.resubscribing = true;
    while (this.nodeLeft && !this.closing) {
      this.nodeLeft = false;
      // The client picks its new subscriber on the same event, a listener later; a SUBSCRIBE
      // still sent to the old one fails, and is tried again.
      await sleep(RESUBSCRIBE_DELAY_MS, undefined, { ref: false });
      const confirmed = await this.subscriber.subscribe(...this.channels).then(
        () => true,
        () => false,
      );
      if (!confirmed) {
        this.nodeLeft = true;
        continue;
      }
      this.recovered();
      await sleep(RESYNC_INTERVAL_MS, undefined, { ref: false });
    }
    this.resubscribing = false;
  }

  /**
   * Subscribes to `channels` and leaves those no longer among them; a resubscription after a
   * node leaves subscribes to these. Resolves once Redis confirmed the change, or after the
   * connect timeout: while Redis is down the change waits in the subscriber's queue, sent on
   * reconnection (which every manager follows with a re-read).
   */
  async follow(channels: readonly string[]): Promise<void> {
    const before = new Set(this.channels);
    const after = new Set(channels);
    this.channels = [...channels];
    const added = channels.filter((c) => !before.has(c));
    const left = [...before].filter((c) => !after.has(c));
    const confirmed = Promise.all([
      added.length > 0 ? this.subscriber.subscribe(...added) : undefined,
      left.length > 0 ? this.subscriber.unsubscribe(...left) : undefined,
    ]).catch((cause: unknown) => {
      throw this.unavailable(cause, 'a subscription');
    });
    await Promise.race([
      confirmed,
      sleep(this.settings.connectTimeoutMs, undefined, { ref: false }),
    ]);
  }

  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.pingTimer);
    await Promise.all([closeRedisClient(this.subscriber), closeRedisClient(this.redis)]);
  }

  /** Never throws: `run` already marked the store unhealthy. */
  private async ping(): Promise<void> {
    await this.run(
      (redis) =>
        redis.tbProbe(
          redisKeys.token(this.probeClient),
          `tb:{${this.probeClient}}:probe-never-exists`,
          `tb:{${this.probeClient}}:probe`,
        ),
      true,
    ).catch(() => undefined);
  }

  /** `probe`: the only success that clears an ACL problem (a read says nothing about scripts). */
  async run<T>(command: (redis: RedisWithScripts) => Promise<T>, probe = false): Promise<T> {
    try {
      const result = await command(this.redis);
      this.markHealthy(probe);
      return result;
    } catch (cause) {
      throw this.unavailable(cause, 'a Redis command');
    }
  }

  /** A success that did not go through {@link run} (the lock's acquisition, say). */
  markHealthy(probe = false): void {
    if (this.tracker.succeeded(probe)) this.recovered();
  }

  /** What this replica heard or wrote may be stale: every listener re-reads. */
  private recovered(): void {
    for (const l of this.recoveredListeners) l();
  }

  unavailable(cause: unknown, what: string): TokenStoreException {
    this.tracker.failed(cause);
    const problem = this.tracker.problem;
    const reason = cause instanceof Error ? cause.message : 'unknown error';
    return new TokenStoreException(
      TokenStoreErrorCode.Unavailable,
      problem
        ? `Redis failed during ${what}: ${problem.message}`
        : `Redis failed during ${what} (${reason}); serving from memory until it returns. Check the Redis settings (REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES) and the Redis server; see "commandTimeoutMs" for how long a command may take`,
      { cause },
    );
  }
}

/** Host and port only, never a password: a URL may carry one. */
/** The nodes named in the settings, and the setting (environment name) that names them. */
function redisNodes(settings: RedisSettings): {
  nodes: string[];
  described: string;
  setting: string;
} {
  if (settings.mode === 'standalone') {
    const setting = 'REDIS_URL';
    if (!URL.canParse(settings.url ?? '')) return { nodes: [], described: 'standalone', setting };
    const { host, protocol } = new URL(settings.url!);
    return { nodes: [host], described: `standalone ${protocol}//${host}`, setting };
  }
  const nodes = [...(settings[settings.mode].nodes ?? [])];
  const via =
    settings.mode === 'sentinel' ? `sentinel ${settings.sentinel.masterName ?? ''}` : 'cluster';
  const setting = settings.mode === 'sentinel' ? 'REDIS_SENTINELS' : 'REDIS_CLUSTER_NODES';
  return { nodes, described: `${via} via ${nodes.join(',')}`, setting };
}
