import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ConnectionOptions } from 'node:tls';
import { Cluster, type ClusterOptions, Redis, type RedisOptions } from 'ioredis';
import type { CredentialsSource } from '../config/client.schema';
import type { RedisSettings } from '../config/config.schema';
import { redisUrlHasPassword } from '../config/redis.schema';
import { shownReference } from '../config/secret-reference';
import { readSource, type SecretReader } from '../secrets/secret-reader';
import { SecretsErrorCode, SecretsException } from '../secrets/secrets.exception';
import {
  explainRedisError,
  explainWrongCredentials,
  isDroppedConnection,
  type RedisProblem,
  tlsMismatch,
} from './redis-problem';
import { speaksOtherProtocol } from './redis-tls.probe';

/** `Redis` (standalone or Sentinel) or `Cluster`: ioredis routes commands, nothing here does. */
export type RedisClient = Redis | Cluster;

/** Commands fail fast; the subscriber may wait to resubscribe. */
type RedisRole = 'command' | 'subscriber';

/** Read at start-up. Never log. */
export interface RedisSecrets {
  readonly password?: string;
  readonly sentinelPassword?: string;
}

/** Once at start-up; a trailing newline (an `echo`-made file) is not part of the password. */
export async function readRedisSecrets(
  settings: RedisSettings,
  reader: SecretReader,
): Promise<RedisSecrets> {
  const read = async (source: CredentialsSource | undefined) =>
    source === undefined
      ? undefined
      : (await readSource(reader, source)).text.replace(/\r?\n$/, '');
  return {
    password: await read(settings.password),
    sentinelPassword: await read(settings.sentinel.password),
  };
}

/** A demoted master keeps the connection open and refuses writes with `READONLY`. */
export function isReadOnlyError(err: Error): boolean {
  return err.message.startsWith('READONLY');
}

/**
 * Nothing waits on a dead Redis: commands time out and fail at once while disconnected, so
 * callers fall back instead of queueing.
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
    // A demoted master answers READONLY on an open connection: reconnect so DNS (or Sentinel)
    // leads to the new master; 2 resends the refused command, safe since a replica applied nothing.
    reconnectOnError: (err) => (isReadOnlyError(err) ? 2 : false),
    keepAlive: 5000,
    connectionName: `token-broker-${role}`,
    lazyConnect: false,
    username: settings.username,
    password: secrets.password,
    tls: tlsOptions(settings),
  };
}

/** Files are read now, once. */
function tlsOptions(settings: RedisSettings): ConnectionOptions | undefined {
  const tls = settings.tls;
  if (!tls.enabled) return undefined;
  const read = (file: string | undefined, setting: string) => {
    if (file === undefined) return undefined;
    try {
      return readFileSync(file);
    } catch (cause) {
      // Not Node's message: it quotes the path, which is printed only if it looks like one.
      const code = (cause as NodeJS.ErrnoException).code ?? 'error';
      const shown = shownReference(file);
      throw new SecretsException(
        code === 'ENOENT' ? SecretsErrorCode.NotFound : SecretsErrorCode.Unavailable,
        `cannot read ${setting} "${shown}" (${code}); check the path and the mount`,
        { source: shown },
      );
    }
  };
  return {
    ca: read(tls.caFile, 'REDIS_TLS_CA_FILE (redis.tls.caFile)'),
    cert: read(tls.certFile, 'REDIS_TLS_CERT_FILE (redis.tls.certFile)'),
    key: read(tls.keyFile, 'REDIS_TLS_KEY_FILE (redis.tls.keyFile)'),
    servername: tls.serverName,
  };
}

type ConnectionPlan =
  | { kind: 'redis'; url?: string; options: RedisOptions }
  | { kind: 'cluster'; nodes: Array<{ host: string; port: number }>; options: ClusterOptions };

/** Pure, for tests. */
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
      // ioredis reads host, port, db and credentials in the URL; rediss:// means TLS.
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
          // +switch-master: a failover reconnects at once, not on the first READONLY.
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

export function createRedisConnection(
  settings: RedisSettings,
  role: RedisRole,
  secrets: RedisSecrets = {},
): RedisClient {
  const plan = connectionPlan(settings, role, secrets);
  let client: RedisClient;
  if (plan.kind === 'cluster') {
    client = new Cluster(plan.nodes, plan.options);
  } else if (plan.url === undefined) {
    client = new Redis(plan.options);
  } else {
    client = new Redis(plan.url, plan.options);
    watchTlsMismatch(client, plan.url, settings);
  }
  // Prepended: the explanation must be in place before the owner's listener reads the error.
  const credentialsFrom = credentialsSource(settings);
  client.prependListener('error', (err: unknown) => explainWrongCredentials(err, credentialsFrom));
  client.prependListener('node error', (err: unknown) =>
    explainWrongCredentials(err, credentialsFrom),
  );
  // The owner is built later (after the cache key is read): an error in between with no
  // listener would make ioredis print a raw non-JSON line. Kept for `takeEarlyError`.
  let last: unknown;
  const keep = (err: unknown) => (last = err);
  client.on('error', keep);
  client.on('node error', keep);
  earlyErrors.set(client, () => {
    client.off('error', keep);
    client.off('node error', keep);
    return last;
  });
  return client;
}

/**
 * Where the credentials the data nodes receive come from. ioredis lets a URL's user and password
 * win over the options, so a URL carrying a password is the place to check, whatever else is set.
 */
export function credentialsSource(settings: RedisSettings): string {
  if (settings.mode === 'standalone' && settings.url !== undefined) {
    if (redisUrlHasPassword(settings.url)) {
      return settings.password === undefined
        ? 'the user and password in REDIS_URL (redis.url)'
        : 'the user and password in REDIS_URL (redis.url), which win over REDIS_PASSWORD_FILE / REDIS_PASSWORD_SECRET_ID: keep the password in one place';
    }
  }
  if (settings.password?.file !== undefined) {
    return 'REDIS_USERNAME and the password in REDIS_PASSWORD_FILE (redis.password.file)';
  }
  if (settings.password?.secretId !== undefined) {
    return 'REDIS_USERNAME and the password in the secret REDIS_PASSWORD_SECRET_ID (redis.password.secretId)';
  }
  return 'REDIS_USERNAME; no password is configured: set REDIS_PASSWORD_FILE or REDIS_PASSWORD_SECRET_ID';
}

/** Least time between two TLS probes of one connection: they only run while it fails. */
const TLS_PROBE_INTERVAL_MS = 5000;

/**
 * A TLS mismatch only shows as dropped or timed-out connections, which read as an outage: a side
 * connection checks whether the port speaks the other protocol, and if so the failures carry
 * that explanation, so the state stays "misconfigured" instead of flapping.
 */
function watchTlsMismatch(client: Redis, url: string, settings: RedisSettings): void {
  const { hostname, port } = new URL(url);
  const target = {
    ...parseHostPort(`${hostname}:${port || 6379}`),
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

const earlyErrors = new WeakMap<RedisClient, () => unknown>();

/** Stops keeping errors and returns the last one reported before the owner listened. */
export function takeEarlyError(client: RedisClient): unknown {
  const take = earlyErrors.get(client);
  earlyErrors.delete(client);
  return take?.();
}

function clusterOptions(node: RedisOptions): ClusterOptions {
  const { retryStrategy, enableOfflineQueue, ...redisOptions } = node;
  return {
    redisOptions,
    enableOfflineQueue,
    clusterRetryStrategy: (times) => retryStrategy!(times),
    // Reads from replicas could miss a token or an idempotency record just written.
    scaleReads: 'master',
    // TLS endpoints present certificates for DNS names: resolving to IPs would fail the check.
    dnsLookup: (address, callback) => callback(null, address),
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 100,
    slotsRefreshTimeout: node.connectTimeout,
    // A partitioned master only makes commands time out, which triggers no slot refresh.
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
 * QUIT, then disconnect: in mode `sentinel` QUIT leaves the detector's subscriptions open. QUIT
 * only on a connection that is up, and for a second at most: on one still connecting, ioredis
 * queues it behind the offline queue, which drains only once Redis answers.
 */
export async function closeRedisClient(client: RedisClient): Promise<void> {
  if (client.status === 'ready') {
    await Promise.race([
      // Already closed or unreachable: nothing left to say goodbye to.
      client.quit().catch(() => undefined),
      sleep(1000, undefined, { ref: false }),
    ]);
  }
  // Whatever QUIT left open; disconnecting a client QUIT already ended kept the process alive.
  if (client.status !== 'end') client.disconnect();
}
