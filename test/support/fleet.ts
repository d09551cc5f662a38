import type { ProviderEmulator, ProviderKnobs } from '../../emulator/provider-emulator';
import type { SecretsManagerEmulator } from '../../emulator/secrets-manager-emulator';
import type { BrokerProcess } from './broker-process';
import { startRedis, type TestRedis } from './redis/standalone';
import type { RedisTopology } from './redis/topology';
import { type Stack, type StackOptions, startStack } from './stack';

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
  /**
   * With `secrets: 'secrets-manager'` only: where the brokers read {@link FLEET_CLIENT}'s
   * credentials (secret `token-broker/fleet-test`).
   */
  secrets: SecretsManagerEmulator | undefined;
  /** The stack's broker processes; {@link Fleet.stop} also stops any a scenario added here. */
  brokers: BrokerProcess[];
  /** Env every broker of this fleet was started with (to start more alike). */
  env: Record<string, string>;
  stop(): Promise<void>;
}

/**
 * {@link startStack} as the fleet scenarios use it: `size` real broker processes for the one
 * client {@link FLEET_CLIENT} (known to the provider emulator by {@link FLEET_CREDENTIALS}),
 * sharing one Redis, and awaited ready. `env` adds to (or overrides) the common settings.
 */
export async function startFleet<R extends TestRedis | RedisTopology = TestRedis>(opts: {
  size: number;
  knobs?: Partial<ProviderKnobs>;
  env?: Record<string, string>;
  /** A Redis the caller stops itself; without it the fleet starts (and stops) its own. */
  redis?: R;
  /** Every broker also has an admin listener (see `StackOptions.admin`). */
  admin?: boolean;
  /** Where the brokers read the client's credentials (see `StackOptions.secrets`). */
  secrets?: StackOptions['secrets'];
}): Promise<Fleet<R>> {
  // A standalone Redis of the fleet's own, for the scenarios that kill or restart it.
  const ownRedis = opts.redis === undefined ? await startRedis() : undefined;
  const redis = opts.redis ?? (ownRedis as R);
  let stack: Stack;
  try {
    stack = await startStack({
      name: 'fleet',
      clients: [{ id: FLEET_CLIENT, credentials: FLEET_CREDENTIALS }],
      secrets: opts.secrets,
      redis,
      replicas: opts.size,
      admin: opts.admin,
      knobs: opts.knobs,
      // The stack's other settings (no caller authentication, a 500 ms floor between two
      // grants for the scenarios' lifetimes of seconds) are the fleet's too.
      env: { LOG_LEVEL: 'warn', ...opts.env },
    });
  } catch (err) {
    await ownRedis?.stop();
    throw err;
  }
  // Processes (the stack's default): every broker has one.
  const brokers = stack.brokers.map((b) => b.process as BrokerProcess);
  return {
    redis,
    emulator: stack.provider,
    secrets: stack.secrets,
    brokers,
    env: stack.env,
    async stop() {
      await Promise.all(brokers.map((b) => b.stop()));
      await stack.close();
      await ownRedis?.stop();
    },
  };
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
