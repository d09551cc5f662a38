import { readFileSync } from 'node:fs';
import type { ConnectionOptions } from 'node:tls';
import { Cluster, type ClusterOptions, Redis, type RedisOptions } from 'ioredis';
import type { CredentialsSource } from '../config/client.schema';
import type { RedisSettings } from '../config/config.schema';
import type { SecretReader } from '../secrets/secret-reader';
import { explainRedisError, type RedisProblem, tlsMismatch } from './redis-problem';
import { speaksOtherProtocol } from './redis-tls.probe';

/**
 * A broker connection to Redis, whatever the topology: one `Redis` for a standalone server
 * (or an ElastiCache primary endpoint) and for a Sentinel-managed master, a `Cluster` for Redis
 * Cluster. Both speak the same commands, `defineCommand` scripts and pub/sub; ioredis routes
 * them (Sentinel discovery, `MOVED`/`ASK`, slot refresh), nothing here does.
 */
export type RedisClient = Redis | Cluster;

/** What a connection is for: commands fail fast; the subscriber may wait to resubscribe. */
export type RedisRole = 'command' | 'subscriber';

/** The passwords named by `redis.password` and `redis.sentinel.password`, read at start-up. Never log. */
export interface RedisSecrets {
  readonly password?: string;
  readonly sentinelPassword?: string;
}

/**
 * Reads the Redis passwords from their secret references (Secrets Manager or a mounted file),
 * once at start-up like the cache-encryption key. A trailing newline (an `echo`-made file) is
 * not part of the password.
 */
export async function readRedisSecrets(
  settings: RedisSettings,
  reader: SecretReader,
): Promise<RedisSecrets> {
  const read = async (source: CredentialsSource | undefined) =>
    source === undefined
      ? undefined
      : (
          await reader.read(
            source.file !== undefined ? { file: source.file } : { secretId: source.secretId! },
          )
        ).replace(/\r?\n$/, '');
  return {
    password: await read(settings.password),
    sentinelPassword: await read(settings.sentinel.password),
  };
}

/**
 * Whether an error reply means "you are talking to a replica": a demoted master (failover
 * behind a fixed endpoint such as an ElastiCache primary endpoint, or a Sentinel switch the
 * client has not noticed) keeps the connection open and refuses writes with `READONLY`.
 */
export function isReadOnlyError(err: Error): boolean {
  return err.message.startsWith('READONLY');
}

/**
 * Options for every broker connection to one Redis node. The point is that nothing waits on a
 * dead Redis: commands fail after `commandTimeoutMs` (a blackholed link) and fail at once while
 * disconnected (no offline queue), so callers fall back to memory instead of queueing.
 */
export function redisOptions(
  settings: RedisSettings,
  role: RedisRole,
  secrets: RedisSecrets = {},
): RedisOptions {
  return {
    connectTimeout: settings.connectTimeoutMs,
    commandTimeout: role === 'command' ? settings.commandTimeoutMs : undefined,
    // The subscriber queues its SUBSCRIBE until connected; command traffic must never queue.
    enableOfflineQueue: role === 'subscriber',
    maxRetriesPerRequest: role === 'command' ? 0 : null,
    // Reconnect forever with a short cap: an outage should end the moment Redis is back.
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 6), 2000),
    // A demoted master answers READONLY on a connection that stays open: reconnect, so the
    // endpoint's DNS (or Sentinel) leads to the new master within seconds, without a restart.
    // 2 also resends the refused command, which is safe (a replica applied nothing) and, with
    // the offline queue off, fails fast instead of waiting for the new connection.
    reconnectOnError: (err) => (isReadOnlyError(err) ? 2 : false),
    keepAlive: 5000,
    connectionName: `token-broker-${role}`,
    lazyConnect: false,
    username: settings.username,
    password: secrets.password,
    tls: tlsOptions(settings),
  };
}

/** TLS options from `redis.tls`, or `undefined` for plain TCP. Files are read now, once. */
export function tlsOptions(settings: RedisSettings): ConnectionOptions | undefined {
  const tls = settings.tls;
  if (!tls.enabled) return undefined;
  const read = (file: string | undefined) => (file === undefined ? undefined : readFileSync(file));
  return {
    ca: read(tls.caFile),
    cert: read(tls.certFile),
    key: read(tls.keyFile),
    // Node checks the certificate against `servername` when set (and sends it as SNI).
    servername: tls.serverName,
  };
}

/** What {@link createRedisConnection} builds: the ioredis class and its options (pure, for tests). */
export type ConnectionPlan =
  | { kind: 'redis'; url?: string; options: RedisOptions }
  | { kind: 'cluster'; nodes: Array<{ host: string; port: number }>; options: ClusterOptions };

/** The connection for the configured topology (`redis.mode`), as data. */
export function connectionPlan(
  settings: RedisSettings,
  role: RedisRole,
  secrets: RedisSecrets = {},
): ConnectionPlan {
  const node = redisOptions(settings, role, secrets);
  switch (settings.mode) {
    case 'standalone':
      if (settings.url === undefined) {
        throw new Error('redis.url (REDIS_URL) is required in mode "standalone"');
      }
      // ioredis reads host, port, db and any user/password in the URL; rediss:// means TLS,
      // and `node.tls` (the schema sets enabled for rediss://) adds the CA and server name.
      return { kind: 'redis', url: settings.url, options: node };
    case 'sentinel':
      return {
        kind: 'redis',
        options: {
          ...node,
          sentinels: settings.sentinel.nodes!.map(parseHostPort),
          name: settings.sentinel.masterName!,
          sentinelUsername: settings.sentinel.username,
          sentinelPassword: secrets.sentinelPassword,
          // Sentinels behind TLS take the same CA and client certificate as the data nodes.
          enableTLSForSentinelMode: settings.tls.enabled,
          sentinelTLS: node.tls,
          sentinelRetryStrategy: node.retryStrategy,
          // Subscribes to +switch-master: a Sentinel failover reconnects at once, not on the
          // first READONLY or closed socket.
          failoverDetector: true,
        },
      };
    case 'cluster':
      return {
        kind: 'cluster',
        nodes: settings.cluster.nodes!.map(parseHostPort),
        options: clusterOptions(node),
      };
  }
}

/**
 * Creates one broker connection for the configured topology (`redis.mode`). Requires a Redis
 * to be configured ({@link redisConfigured}).
 */
export function createRedisConnection(
  settings: RedisSettings,
  role: RedisRole,
  secrets: RedisSecrets = {},
): RedisClient {
  const plan = connectionPlan(settings, role, secrets);
  const client =
    plan.kind === 'cluster'
      ? new Cluster(plan.nodes, plan.options)
      : plan.url === undefined
        ? new Redis(plan.options)
        : new Redis(plan.url, plan.options);
  // The connection starts at once, but its owner (the token store) is built later, after the
  // cache key is read, maybe from Secrets Manager. An error in between with no listener would
  // make ioredis print a raw "[ioredis] Unhandled error event" line to stderr, the only
  // non-JSON line the broker wrote. Keep the last one for the owner instead (see
  // `takeEarlyError`).
  const early: EarlyErrors = { listener: (err: unknown) => (early.last = err) };
  if (plan.kind === 'redis' && plan.url !== undefined) {
    watchTlsMismatch(client as Redis, plan.url, settings);
  }
  client.on('error', early.listener);
  client.on('node error', early.listener);
  earlyErrors.set(client, early);
  return client;
}

/** Least time between two TLS probes of one connection: they only run while it fails. */
const TLS_PROBE_INTERVAL_MS = 5000;

/**
 * A Redis that speaks TLS and a broker that does not (or the reverse) only ever see the
 * connection dropped or timing out, which reads as an outage. When a connection fails that
 * way, a side connection checks (at most every few seconds) whether the port speaks the other
 * protocol; if it does, that is reported as an error of its own, and the failures that follow
 * carry it (see `explainRedisError`), so the state stays "misconfigured" instead of flapping
 * back to "unreachable". A later probe that finds no mismatch (the server went away) drops it.
 */
function watchTlsMismatch(client: Redis, url: string, settings: RedisSettings): void {
  const { hostname, port } = new URL(url);
  const target = {
    host: hostname.replace(/^\[(.*)\]$/, '$1'),
    port: Number(port || 6379),
    tls: settings.tls.enabled,
    serverName: settings.tls.serverName,
    timeoutMs: settings.connectTimeoutMs,
  };
  let found: RedisProblem | undefined;
  let probing = false;
  let lastProbe = -Infinity;
  client.on('ready', () => (found = undefined));
  // Prepended: the explanation must be in place before the owner's listener reads the error.
  client.prependListener('error', (err: unknown) => {
    if (!(err instanceof Error) || !isDroppedConnection(err)) return;
    if (found !== undefined) explainRedisError(err, found);
    if (probing || Date.now() - lastProbe < TLS_PROBE_INTERVAL_MS) return;
    probing = true;
    lastProbe = Date.now();
    void speaksOtherProtocol(target).then((mismatch) => {
      probing = false;
      if (!mismatch) {
        found = undefined;
        return;
      }
      if (found !== undefined || client.status === 'ready' || client.status === 'end') return;
      found = tlsMismatch(target.tls);
      const report = new Error(found.message);
      explainRedisError(report, found);
      client.emit('error', report);
    });
  });
}

/**
 * A connection that opened but never came up: what a TLS mismatch looks like. A TLS server
 * drops a client speaking clear; a plain server waits for the end of a "command" that is a
 * TLS handshake, so the connect times out.
 */
function isDroppedConnection(err: Error): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ECONNRESET' || code === 'EPIPE' || code === 'ETIMEDOUT';
}

interface EarlyErrors {
  last?: unknown;
  readonly listener: (err: unknown) => void;
}

const earlyErrors = new WeakMap<RedisClient, EarlyErrors>();

/**
 * For the owner of a connection, once its own `error` listener is attached: stops keeping
 * errors and returns the last one reported before, if any.
 */
export function takeEarlyError(client: RedisClient): unknown {
  const early = earlyErrors.get(client);
  if (early === undefined) return undefined;
  earlyErrors.delete(client);
  client.off('error', early.listener);
  client.off('node error', early.listener);
  return early.last;
}

function clusterOptions(node: RedisOptions): ClusterOptions {
  const {
    retryStrategy,
    enableOfflineQueue,
    // Per-node options the Cluster type does not accept inside `redisOptions`.
    ...redisOptions
  } = node;
  return {
    redisOptions,
    enableOfflineQueue,
    clusterRetryStrategy: (times) => retryStrategy!(times),
    // Reads from replicas could miss a token or an idempotency record just written.
    scaleReads: 'master',
    // TLS endpoints (ElastiCache) present certificates for their DNS names: resolving them to
    // IPs here would make every hostname check fail, so let the TLS socket resolve them.
    dnsLookup: (address, callback) => callback(null, address),
    // A slot that moved during a failover is retried briefly after a refresh of the slot map;
    // the command timeout still bounds the caller's wait.
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 100,
    slotsRefreshTimeout: node.connectTimeout,
    // A crashed master closes its connections, and ioredis re-reads the slot map then. A
    // partitioned one (packets dropped) only makes commands time out, which triggers nothing:
    // re-read the map every couple of seconds (one CLUSTER SLOTS) so a promoted replica is
    // found in that case too.
    slotsRefreshInterval: 2000,
  };
}

/** `host:port` (IPv6 in brackets) as validated by the schema. */
export function parseHostPort(value: string): { host: string; port: number } {
  const colon = value.lastIndexOf(':');
  const host = value.slice(0, colon).replace(/^\[(.*)\]$/, '$1');
  return { host, port: Number(value.slice(colon + 1)) };
}

/**
 * Closes a connection politely (QUIT, so pending replies arrive) and then for good: in mode
 * `sentinel`, QUIT alone leaves the failover detector's sentinel subscriptions open, which
 * would keep the process alive after shutdown.
 *
 * QUIT is only sent on a connection that is up, and only waited for `quitTimeoutMs`: on a
 * connection still (re)connecting, ioredis queues QUIT behind whatever waits in the offline
 * queue (the subscriber's SUBSCRIBE), and that queue only drains once Redis answers. A replica
 * started while Redis was unreachable then never finished shutting down.
 */
export async function closeRedisClient(client: RedisClient, quitTimeoutMs = 1000): Promise<void> {
  if (client.status === 'ready') {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        client.quit(),
        new Promise((resolve) => {
          timer = setTimeout(resolve, quitTimeoutMs);
        }),
      ]);
    } catch {
      // Already closed or unreachable: nothing left to say goodbye to.
    } finally {
      clearTimeout(timer);
    }
  }
  // Whatever QUIT left open (the sentinel subscriptions, a connection that never came up, a
  // QUIT without answer): disconnecting a client that QUIT already ended was seen to keep the
  // process alive, hence the check.
  if (client.status !== 'end') client.disconnect();
}
