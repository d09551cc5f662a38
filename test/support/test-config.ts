import type { z } from 'zod';
import { type ClientConfig, clientSchema } from '../../src/config/client.schema';
import { type BrokerConfig, brokerConfigSchema } from '../../src/config/config.schema';

/**
 * The broker configuration the unit specs build their subjects from: one client whose provider
 * is never reached (`.invalid` hosts; the specs fake the provider, the secrets and the store),
 * no caller auth, loopback only. Each spec overrides what its subject reads.
 */

/** A client's settings as a config file holds them (before the schema fills in defaults). */
export type ClientInput = z.input<typeof clientSchema>;
/** The broker's settings as a config file holds them. */
export type BrokerConfigInput = z.input<typeof brokerConfigSchema>;

/** The test client, unparsed: `acme`, its credentials in a file nobody reads. */
export const TEST_CLIENT = {
  id: 'acme',
  authUrl: 'http://auth.invalid',
  baseUrl: 'http://api.invalid',
  credentials: { file: '/dev/null' },
} as const satisfies ClientInput;

/** {@link TEST_CLIENT} with `overrides`, parsed. */
export function testClient(overrides: Partial<ClientInput> = {}): ClientConfig {
  return clientSchema.parse({ ...TEST_CLIENT, ...overrides });
}

/**
 * The broker's whole configuration, parsed: {@link TEST_CLIENT} as its only client, caller auth
 * off (`NODE_ENV` test), listening on loopback, every other section at its default. `overrides`
 * replaces whole top-level sections (`clients`, `token`, `orders`...).
 */
export function testConfig(overrides: Partial<BrokerConfigInput> = {}): BrokerConfig {
  return brokerConfigSchema.parse({
    clients: [TEST_CLIENT],
    callerAuth: { mode: 'none', allowNone: true },
    http: { host: '127.0.0.1' },
    // Unset is production: caller auth could not be off.
    nodeEnv: 'test',
    ...overrides,
  });
}
