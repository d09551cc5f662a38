import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { ServiceAccountIssuer } from '../emulator/service-account-issuer';

/** The service account the benches' `kubernetes` callers present a token of. */
const SUBJECT = 'system:serviceaccount:bench:caller';

/** What {@link startBenchSetup} starts and writes, for brokers configured by environment. */
export interface BenchSetup {
  provider: ProviderEmulator;
  issuer: ServiceAccountIssuer;
  /** `CLIENT_ID`, the provider emulator as provider, `HOST`: what every broker is given. */
  env: Record<string, string>;
  /** The client's credentials, in a file (`CREDENTIALS_FILE`). */
  credentialsFile: string;
  /** Writes a file (mode 0600) in the set-up's temporary folder; returns its path. */
  file(name: string, content: string): string;
  /** The key of the one API-key caller, `bench`, allowed every client. */
  apiKey: string;
  /** Caller authentication in mode `api-key`, knowing {@link apiKey}. */
  apiKeyAuth: Record<string, string>;
  /** Caller authentication in mode `kubernetes`: the issuer's JWKS, one subject for every client. */
  kubernetesAuth: Record<string, string>;
  /** A projected service-account token (RS256) that {@link kubernetesAuth} accepts. */
  serviceAccountToken(): Promise<string>;
  /** Stops the emulators and removes the folder. */
  close(): Promise<void>;
}

/**
 * The provider emulator knowing one client, a service-account issuer, and the files the benches'
 * brokers read (credentials, API-key hashes) in a temporary folder `tb-bench-<name>-…`.
 */
export async function startBenchSetup(opts: {
  name: string;
  clientId: string;
  credentials: { client_id: string; client_secret: string };
}): Promise<BenchSetup> {
  const provider = await ProviderEmulator.start({
    credentials: { [opts.credentials.client_id]: opts.credentials.client_secret },
  });
  const issuer = await ServiceAccountIssuer.start().catch(async (err: unknown) => {
    await provider.close();
    throw err;
  });
  const dir = mkdtempSync(join(tmpdir(), `tb-bench-${opts.name}-`));
  const file = (name: string, content: string) => {
    const path = join(dir, name);
    writeFileSync(path, content, { mode: 0o600 });
    return path;
  };
  const apiKey = randomBytes(32).toString('base64url');
  return {
    provider,
    issuer,
    env: {
      CLIENT_ID: opts.clientId,
      PROVIDER_AUTH_URL: provider.url,
      PROVIDER_BASE_URL: provider.url,
      HOST: '127.0.0.1',
    },
    credentialsFile: file('credentials.json', JSON.stringify(opts.credentials)),
    file,
    apiKey,
    apiKeyAuth: {
      CALLER_AUTH_MODE: 'api-key',
      CALLER_API_KEYS_FILE: file(
        'api-keys.json',
        JSON.stringify([
          {
            name: 'bench',
            sha256: createHash('sha256').update(apiKey).digest('hex'),
            clients: ['*'],
          },
        ]),
      ),
    },
    kubernetesAuth: {
      CALLER_AUTH_MODE: 'kubernetes',
      CALLER_AUTH_JWKS_URL: issuer.jwksUrl,
      CALLER_AUTH_ISSUER: issuer.issuer,
      CALLER_AUTH_AUDIENCE: issuer.audience,
      CALLER_AUTH_SUBJECTS: JSON.stringify({ [SUBJECT]: ['*'] }),
    },
    serviceAccountToken: () => issuer.token({ subject: SUBJECT, alg: 'RS256' }),
    async close() {
      await Promise.all([provider.close(), issuer.close()]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
