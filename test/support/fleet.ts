import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProviderEmulator, type ProviderKnobs } from '../../emulator/provider-emulator';
import { type BrokerProcess, spawnBroker } from './broker-process';
import { startRedis, type TestRedis } from './redis-server';
import type { RedisTopology } from './redis-topology';

/** A client id and credentials the fleet helpers use everywhere. */
export const FLEET_CLIENT = 'fleet-test';
export const FLEET_CREDENTIALS = { client_id: 'fleet-client', client_secret: 'fleet-secret-value' };

/**
 * A fleet of brokers. `R` is what the fleet's Redis was given as: a standalone
 * {@link TestRedis} (the default, which fault tests kill and restart), or a
 * {@link RedisTopology} (Sentinel, Cluster, a failover pair) whose `env()` the brokers get.
 */
export interface Fleet<R extends TestRedis | RedisTopology = TestRedis> {
  redis: R;
  emulator: ProviderEmulator;
  brokers: BrokerProcess[];
  credentialsFile: string;
  /** Env every broker of this fleet was started with (to start more alike). */
  env: Record<string, string>;
  stop(): Promise<void>;
}

/**
 * Starts `size` real broker processes sharing one Redis and one provider emulator, and waits
 * until every one is ready. `env` adds to (or overrides) the common settings.
 */
export async function startFleet<R extends TestRedis | RedisTopology = TestRedis>(opts: {
  size: number;
  knobs?: Partial<ProviderKnobs>;
  env?: Record<string, string>;
  /** A Redis the caller stops itself; without it the fleet starts (and stops) its own. */
  redis?: R;
  /** Every broker also has an admin listener (see `SpawnBrokerOptions.admin`). */
  admin?: boolean;
}): Promise<Fleet<R>> {
  const redis = opts.redis ?? ((await startRedis()) as R);
  const emulator = await ProviderEmulator.start({
    credentials: { [FLEET_CREDENTIALS.client_id]: FLEET_CREDENTIALS.client_secret },
    knobs: opts.knobs,
  });
  const dir = mkdtempSync(join(tmpdir(), 'tb-fleet-'));
  const credentialsFile = join(dir, 'credentials.json');
  writeFileSync(credentialsFile, JSON.stringify(FLEET_CREDENTIALS), { mode: 0o600 });
  const env: Record<string, string> = {
    CLIENT_ID: FLEET_CLIENT,
    ...redisEnv(redis),
    PROVIDER_AUTH_URL: emulator.url,
    PROVIDER_BASE_URL: emulator.url,
    CREDENTIALS_FILE: credentialsFile,
    CALLER_AUTH_MODE: 'none',
    CALLER_AUTH_ALLOW_NONE: 'true',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'warn',
    // The scenarios use lifetimes of seconds, far below production's; the default floor
    // between two grants (5 s) would make those too short to serve. Scenarios about the floor
    // set their own.
    TOKEN_MIN_REFRESH_INTERVAL_MS: '500',
    ...opts.env,
  };
  const brokers = await Promise.all(
    Array.from({ length: opts.size }, (_, i) =>
      spawnBroker({ env, name: `broker-${i}`, admin: opts.admin }),
    ),
  );
  try {
    await Promise.all(brokers.map((b) => b.waitReady(15_000)));
  } catch (err) {
    await Promise.all(brokers.map((b) => b.stop()));
    await emulator.close();
    if (!opts.redis) await redis.stop();
    throw err;
  }
  return {
    redis,
    emulator,
    brokers,
    credentialsFile,
    env,
    async stop() {
      await Promise.all(brokers.map((b) => b.stop()));
      await emulator.close();
      if (!opts.redis) await redis.stop();
    },
  };
}

/** The broker settings that point at `redis`. */
function redisEnv(redis: TestRedis | RedisTopology): Record<string, string> {
  return 'env' in redis ? redis.env() : { REDIS_URL: redis.url };
}

/**
 * Groups token request times into refresh cycles: requests closer than `gapMs` belong to one
 * cycle. Returns the number of requests in each cycle.
 */
export function requestsPerCycle(times: readonly number[], gapMs: number): number[] {
  const sorted = [...times].sort((a, b) => a - b);
  const cycles: number[] = [];
  let last = -Infinity;
  for (const t of sorted) {
    if (t - last > gapMs) cycles.push(0);
    cycles[cycles.length - 1]++;
    last = t;
  }
  return cycles;
}
