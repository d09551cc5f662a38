import { z } from 'zod';
import { credentialsSourceSchema } from './client.schema';
import { commaList, flag, int, issuesOf } from './schema-parts';
import { filePathSchema } from './secret-reference';

/** The Redis topologies the broker speaks, each through ioredis's own support. */
export const REDIS_MODES = ['standalone', 'sentinel', 'cluster'] as const;
export type RedisMode = (typeof REDIS_MODES)[number];

/** `host:port`, with an IPv6 host in brackets (`[::1]:6379`). */
const hostPort = z
  .string()
  .trim()
  .regex(/^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d{1,5}$/, {
    message: 'must be host:port (an IPv6 host in brackets)',
  })
  // Only judged once the shape is right, so a bad entry gets one message, not two.
  .refine((v) => !/:\d+$/.test(v) || Number(v.slice(v.lastIndexOf(':') + 1)) <= 65_535, {
    message: 'port must be 1-65535',
  });

/** A list of `host:port`, also accepted comma-separated (the environment variable form). */
const hostPortList = z.preprocess(
  commaList,
  z.array(hostPort).min(1, { message: 'list at least one host:port' }),
);

const redisSentinelSchema = z
  .object({
    nodes: hostPortList.optional().meta({
      description:
        'Sentinel addresses (`host:port`, port usually 26379). Required in mode `sentinel`.',
      env: 'REDIS_SENTINELS',
    }),
    masterName: z
      .string()
      .min(1)
      .optional()
      .meta({
        description:
          'The master group name the sentinels monitor (`sentinel ' +
          'monitor <name> ...`). Required in mode `sentinel`.',
        env: 'REDIS_SENTINEL_MASTER',
      }),
    username: z.string().min(1).optional().meta({
      description: 'ACL user for the sentinels themselves (`SENTINEL` ACL).',
      defaultText: 'undefined (no user)',
      env: 'REDIS_SENTINEL_USERNAME',
    }),
    password: credentialsSourceSchema.optional().meta({
      description: 'Password for the sentinels (`requirepass` of the sentinel processes).',
      defaultText: 'undefined (none)',
      envFields: {
        secretId: 'REDIS_SENTINEL_PASSWORD_SECRET_ID',
        file: 'REDIS_SENTINEL_PASSWORD_FILE',
      },
    }),
  })
  .strict();

const redisClusterSchema = z
  .object({
    nodes: hostPortList.optional().meta({
      description:
        'Seed nodes (`host:port`), or the one configuration endpoint of a ' +
        'managed cluster (ElastiCache cluster mode, MemoryDB): ioredis ' +
        'discovers every node from `CLUSTER SLOTS`. Required in mode `cluster`.',
      env: 'REDIS_CLUSTER_NODES',
    }),
  })
  .strict();

const redisTlsSchema = z
  .object({
    enabled: flag.default(false).meta({
      description:
        'TLS to Redis (and to the sentinels in mode `sentinel`). A `rediss://` URL turns it on.',
      env: 'REDIS_TLS',
    }),
    caFile: filePathSchema.optional().meta({
      description: 'PEM bundle of the CA(s) that signed the server certificate.',
      defaultText: 'undefined (the system trust store)',
      env: 'REDIS_TLS_CA_FILE',
    }),
    certFile: filePathSchema.optional().meta({
      description: 'PEM client certificate for mutual TLS; needs `keyFile`.',
      defaultText: 'undefined',
      env: 'REDIS_TLS_CERT_FILE',
    }),
    keyFile: filePathSchema.optional().meta({
      description: 'PEM private key of `certFile`.',
      defaultText: 'undefined',
      env: 'REDIS_TLS_KEY_FILE',
    }),
    serverName: z
      .string()
      .min(1)
      .optional()
      .meta({
        description:
          'Hostname the server certificate must name (and ' +
          'SNI) when it differs from the address dialled.',
        defaultText: 'undefined (the host dialled)',
        env: 'REDIS_TLS_SERVER_NAME',
      }),
  })
  .strict();

export const redisSettingsSchema = z
  .object({
    mode: z.enum(REDIS_MODES).default('standalone').meta({
      description: 'Which topology `url`, `sentinel` or `cluster` describes.',
      env: 'REDIS_MODE',
    }),
    url: z
      .string()
      .regex(/^rediss?:\/\/[^\s]+$/, { message: 'must be a redis:// or rediss:// URL' })
      // ioredis dials localhost for a URL without a host: a typo would pass as an outage.
      .refine((url) => redisUrlHost(url) !== '', {
        message: 'names no host: write redis[s]://[[user]:password@]host[:port][/db]',
      })
      .optional()
      .meta({
        description:
          '`redis://` or `rediss://` URL, mode `standalone` only (e.g. an ElastiCache primary ' +
          'endpoint). Unset in mode `standalone`: in-memory store, single replica only.',
        defaultText: 'undefined',
        env: 'REDIS_URL',
      }),
    sentinel: redisSentinelSchema.prefault({}),
    cluster: redisClusterSchema.prefault({}),
    username: z.string().min(1).optional().meta({
      description: 'ACL user for the data nodes.',
      defaultText: 'undefined (the `default` user)',
      env: 'REDIS_USERNAME',
    }),
    password: credentialsSourceSchema.optional().meta({
      description: 'Password of `username` (or `requirepass`), read at start-up.',
      defaultText: 'undefined (none)',
      envFields: { secretId: 'REDIS_PASSWORD_SECRET_ID', file: 'REDIS_PASSWORD_FILE' },
    }),
    tls: redisTlsSchema.prefault({}),
    commandTimeoutMs: int(20, 30_000).default(500).meta({
      description:
        'Every Redis command fails after this long, so no request queues behind a dead link.',
      env: 'REDIS_COMMAND_TIMEOUT_MS',
    }),
    connectTimeoutMs: int(50, 60_000).default(2000),
    pingIntervalMs: int(50, 60_000).default(1000).meta({
      description: 'Health ping interval; also how soon a returning Redis is noticed.',
      env: 'REDIS_PING_INTERVAL_MS',
    }),
  })
  .strict()
  .superRefine((r, ctx) => {
    const issue = issuesOf(ctx);
    if (r.mode !== 'standalone' && r.url !== undefined) {
      issue(['url'], `only in mode "standalone"; mode "${r.mode}" finds its nodes itself`);
    }
    if (r.mode === 'sentinel') {
      if (r.sentinel.nodes === undefined)
        issue(['sentinel', 'nodes'], 'required in mode "sentinel"');
      if (r.sentinel.masterName === undefined) {
        issue(['sentinel', 'masterName'], 'required in mode "sentinel"');
      }
    } else {
      // A sentinel list with the mode left at standalone would silently use memory instead.
      for (const field of ['nodes', 'masterName', 'username', 'password'] as const) {
        if (r.sentinel[field] !== undefined) {
          issue(['sentinel', field], 'only in mode "sentinel"; set the mode to "sentinel"');
        }
      }
    }
    if (r.mode === 'cluster') {
      if (r.cluster.nodes === undefined) issue(['cluster', 'nodes'], 'required in mode "cluster"');
    } else if (r.cluster.nodes !== undefined) {
      issue(['cluster', 'nodes'], 'only in mode "cluster"; set the mode to "cluster"');
    }
    if (!redisConfigured(r)) {
      for (const field of ['username', 'password'] as const) {
        if (r[field] !== undefined)
          issue([field], 'set only with a Redis (url, sentinel or cluster)');
      }
    }
    if ((r.tls.certFile === undefined) !== (r.tls.keyFile === undefined)) {
      issue(
        ['tls', r.tls.certFile === undefined ? 'certFile' : 'keyFile'],
        'set the client certificate and its key together (certFile and keyFile)',
      );
    }
    const tlsOn = r.tls.enabled || r.url?.startsWith('rediss://') === true;
    if (!tlsOn) {
      for (const field of ['caFile', 'certFile', 'keyFile', 'serverName'] as const) {
        if (r.tls[field] !== undefined) {
          issue(
            ['tls', field],
            'has no effect without TLS: turn tls.enabled on (or use rediss://)',
          );
        }
      }
    }
  })
  // `rediss://` means TLS: one flag for the connection factory to read.
  .transform((r) =>
    r.url?.startsWith('rediss://') ? { ...r, tls: { ...r.tls, enabled: true } } : r,
  );

/**
 * Whether the broker uses Redis at all: any Sentinel or Cluster, or a standalone URL. Without
 * one the stores live in process memory (single replica only).
 */
export function redisConfigured(settings: { mode: RedisMode; url?: string | undefined }): boolean {
  return settings.mode !== 'standalone' || settings.url !== undefined;
}

/**
 * The host of a Redis URL as ioredis reads it (what follows the last `@` before the path), or
 * `''` when the URL names none (`redis://:6379`, `redis:///0`). Never returns the password.
 */
export function redisUrlHost(url: string): string {
  const hostPort = urlAuthority(url).replace(/^.*@/, '');
  return hostPort.replace(/:\d*$/, '').replace(/^\[(.*)\]$/, '$1');
}

/** Whether the URL carries a password (`redis://[user]:password@host`), which ioredis sends. */
export function redisUrlHasPassword(url: string): boolean {
  const at = urlAuthority(url).lastIndexOf('@');
  return at !== -1 && /:./.test(urlAuthority(url).slice(0, at));
}

function urlAuthority(url: string): string {
  return url.replace(/^rediss?:\/\//, '').split(/[/?#]/)[0];
}
