import { createHash } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** One API key of a written config: the key itself is hashed, as the broker expects. */
export interface ApiKeyGrant {
  name: string;
  key: string;
  clients: string[];
  /** The key's scopes; absent: the default ones. */
  scopes?: string[];
}

/** Options for {@link writeBrokerConfig}. */
export interface BrokerConfigOptions {
  /** The provider (emulator) URL every client uses for both `authUrl` and `baseUrl`. */
  providerUrl: string;
  /** `{client_id, client_secret}` the provider accepts, written to one file all clients read. */
  credentials: { client_id: string; client_secret: string };
  clientIds: string[];
  /** `callerAuth` besides the API keys (`mode`, `kubernetes`). */
  callerAuth?: Record<string, unknown>;
  apiKeys?: ApiKeyGrant[];
  /** Prefix of the temporary directory. */
  name: string;
}

/**
 * Writes a `BROKER_CONFIG_FILE` for tests that start brokers on a file config: every client on
 * the same provider and credentials file, API keys stored as the SHA-256 the broker compares.
 * Returns the directory (remove it after the test) and the config file's path.
 */
export function writeBrokerConfig(opts: BrokerConfigOptions): { dir: string; configFile: string } {
  const dir = mkdtempSync(join(tmpdir(), `${opts.name}-`));
  const credentials = join(dir, 'credentials.json');
  writeFileSync(credentials, JSON.stringify(opts.credentials), { mode: 0o600 });
  const configFile = join(dir, 'broker.json');
  writeFileSync(
    configFile,
    JSON.stringify({
      clients: opts.clientIds.map((id) => ({
        id,
        authUrl: opts.providerUrl,
        baseUrl: opts.providerUrl,
        credentials: { file: credentials },
      })),
      callerAuth: {
        ...opts.callerAuth,
        ...(opts.apiKeys && {
          apiKeys: opts.apiKeys.map((k) => ({
            name: k.name,
            sha256: createHash('sha256').update(k.key).digest('hex'),
            clients: k.clients,
            ...(k.scopes && { scopes: k.scopes }),
          })),
        }),
      },
    }),
  );
  return { dir, configFile };
}
