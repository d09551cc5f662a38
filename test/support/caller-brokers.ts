import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProviderEmulator, type ProviderKnobs } from '../../emulator/provider-emulator';
import {
  SecretsManagerEmulator,
  secretsManagerClientEnv,
} from '../../emulator/secrets-manager-emulator';
import { ServiceAccountIssuer } from '../../emulator/service-account-issuer';
import { type BrokerProcess, spawnBroker } from './broker-process';
import { newKey, sha256 } from './stack';
import { waitFor } from './wait';

/** The provider clients every caller-facing test configures. */
export const CALLER_CLIENTS = ['acme-prod', 'globex-prod'] as const;
/** A configured client whose stored secret the provider refuses: no token can ever be had. */
export const UNAVAILABLE_CLIENT = 'initech-prod';
export const CHECKOUT_SA = 'system:serviceaccount:shop:checkout';
export const OPS_SA = 'system:serviceaccount:shop:ops';
export const JWT_BEARER = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer';

export { newKey, sha256 };
/** The audit line's `fp`: the first 16 hex digits of the token's SHA-256. */
export const fingerprint = (token: string): string => sha256(token).slice(0, 16);

/** How to start {@link startCallerBrokers}. */
export interface CallerBrokersOptions {
  /** Label prefix of the broker processes. */
  name: string;
  /**
   * API-key callers and the clients each may use.
   * @default { checkout: ['acme-prod'], ops: ['*'] }
   */
  callers?: Record<string, string[]>;
  /** Scopes of the API-key callers named here (`token`, `forward`, `admin`); others get the default. */
  callerScopes?: Record<string, string[]>;
  /** Also start a broker in caller-auth mode `kubernetes` (a local JWKS issuer). */
  kubernetes?: boolean;
  /**
   * Service-account subjects and the clients each may use (mode `kubernetes`).
   * @default { [CHECKOUT_SA]: ['acme-prod'], [OPS_SA]: ['*'] }
   */
  subjects?: Record<string, string[]>;
  /**
   * Also configure `initech-prod`, whose credentials the provider refuses (for
   * `temporarily_unavailable`/503). Without it the brokers become ready and are awaited so.
   * @default true
   */
  unavailableClient?: boolean;
  /** Provider emulator behaviour. */
  knobs?: Partial<ProviderKnobs>;
  /** Added to (or overriding) both brokers' environment. */
  env?: Record<string, string>;
}

/** Real broker processes with the emulators they talk to. */
export interface CallerBrokers {
  provider: ProviderEmulator;
  secrets: SecretsManagerEmulator;
  issuer: ServiceAccountIssuer;
  /** Caller-auth mode `api-key`, keys from the Secrets Manager emulator. */
  apiKeyBroker: BrokerProcess;
  /** Caller-auth mode `kubernetes`; only with `kubernetes: true`. */
  k8sBroker?: BrokerProcess;
  /** The API key of each caller in `callers`. */
  keys: Record<string, string>;
  /** Every secret value the set-up made (provider secrets, API keys): none may leak. */
  secretValues: string[];
  stop(): Promise<void>;
}

/**
 * The set-up the caller-facing e2e tests share: a provider emulator knowing two merchants
 * (`acme-prod`, `globex-prod`) and refusing a third (`initech-prod`), their secrets and the
 * callers' API-key hashes in a Secrets Manager emulator, a service-account issuer, and real
 * brokers (`node dist/main.js`, run `npm run build` first) with the in-memory token store.
 * With `initech-prod`, readiness is polled on the two working clients (GET /token answering
 * 200), not /health/ready: initech-prod never gets a token, by design.
 */
export async function startCallerBrokers(opts: CallerBrokersOptions): Promise<CallerBrokers> {
  const merchant = (prefix: string) => ({
    client_id: `${prefix}-merchant`,
    client_secret: `${prefix}-${randomBytes(12).toString('hex')}`,
  });
  const acme = merchant('acme');
  const globex = merchant('globex');
  const initech = { client_id: 'initech-merchant', client_secret: 'not-what-the-provider-knows' };
  const callers = opts.callers ?? { checkout: ['acme-prod'], ops: ['*'] };
  const withUnavailable = opts.unavailableClient ?? true;
  const keys = Object.fromEntries(Object.keys(callers).map((name) => [name, newKey()]));
  const secretIds = {
    acme: 'token-broker/acme-prod',
    globex: 'token-broker/globex-prod',
    initech: 'token-broker/initech-prod',
    apiKeys: 'token-broker/caller-api-keys',
  };

  const provider = await ProviderEmulator.start({
    credentials: {
      [acme.client_id]: acme.client_secret,
      [globex.client_id]: globex.client_secret,
      [initech.client_id]: 'the-real-initech-secret',
    },
    knobs: opts.knobs,
  });
  const secrets = await SecretsManagerEmulator.start({
    secrets: {
      [secretIds.acme]: JSON.stringify(acme),
      [secretIds.globex]: JSON.stringify(globex),
      [secretIds.initech]: JSON.stringify(initech),
      [secretIds.apiKeys]: JSON.stringify(
        Object.entries(callers).map(([name, clients]) => ({
          name,
          sha256: sha256(keys[name]),
          clients,
          ...(opts.callerScopes?.[name] && { scopes: opts.callerScopes[name] }),
        })),
      ),
    },
  });
  const issuer = await ServiceAccountIssuer.start();
  const dir = mkdtempSync(join(tmpdir(), 'tb-callers-'));
  const configFile = join(dir, 'broker.json');
  const client = (id: string, secretId: string) => ({
    id,
    authUrl: provider.url,
    baseUrl: provider.url,
    credentials: { secretId },
  });
  writeFileSync(
    configFile,
    JSON.stringify({
      clients: [
        client('acme-prod', secretIds.acme),
        client('globex-prod', secretIds.globex),
        ...(withUnavailable ? [client(UNAVAILABLE_CLIENT, secretIds.initech)] : []),
      ],
      callerAuth: {
        kubernetes: {
          jwksUrl: issuer.jwksUrl,
          issuer: issuer.issuer,
          audience: 'token-broker',
          subjects: opts.subjects ?? { [CHECKOUT_SA]: ['acme-prod'], [OPS_SA]: ['*'] },
        },
      },
    }),
  );
  const env = {
    BROKER_CONFIG_FILE: configFile,
    HOST: '127.0.0.1',
    LOG_LEVEL: 'debug',
    ...secretsManagerClientEnv(secrets.url),
    // Some suites run on tokens of seconds (the stock clients re-asking near expiry); the
    // default floor between two grants (5 s) is for production lifetimes.
    TOKEN_MIN_REFRESH_INTERVAL_MS: '500',
    // Aggregated audit lines every second rather than 10: tests wait for them.
    AUDIT_INTERVAL_SECONDS: '1',
    ...opts.env,
  };
  const brokers: BrokerProcess[] = [];
  const stop = async () => {
    await Promise.all(brokers.map((b) => b.stop()));
    await Promise.all([provider.close(), secrets.close(), issuer.close()]);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const apiKeyBroker = await spawnBroker({
      name: `${opts.name}-api-key-broker`,
      env: { ...env, CALLER_AUTH_MODE: 'api-key', CALLER_API_KEYS_SECRET_ID: secretIds.apiKeys },
    });
    brokers.push(apiKeyBroker);
    const k8sBroker = opts.kubernetes
      ? await spawnBroker({
          name: `${opts.name}-k8s-broker`,
          env: { ...env, CALLER_AUTH_MODE: 'kubernetes' },
        })
      : undefined;
    if (k8sBroker) brokers.push(k8sBroker);
    if (!withUnavailable) {
      await Promise.all(brokers.map((b) => b.waitReady()));
    }
    // Readiness is polled as a caller that may read the token.
    const readers = Object.keys(callers).filter(
      (name) => opts.callerScopes?.[name]?.includes('token') ?? true,
    );
    const wildcard = readers.find((name) => callers[name].includes('*'));
    await waitFor(
      async () => {
        const codes = await Promise.all(
          CALLER_CLIENTS.map(async (c) => {
            const caller = wildcard ?? readers.find((name) => callers[name].includes(c));
            if (!caller) return 200;
            return (
              await fetch(`${apiKeyBroker.url}/token?client=${c}`, {
                headers: { authorization: `Bearer ${keys[caller]}` },
              }).catch(() => ({ status: 0 }))
            ).status;
          }),
        );
        return codes.every((s) => s === 200) || undefined;
      },
      { timeoutMs: 20_000, what: `${apiKeyBroker.name} serving tokens` },
    );
    if (k8sBroker) {
      await waitFor(
        async () =>
          (await fetch(`${k8sBroker.url}/health/live`).catch(() => ({ ok: false }))).ok ||
          undefined,
        { timeoutMs: 20_000, what: `${k8sBroker.name} listening` },
      );
    }
    return {
      provider,
      secrets,
      issuer,
      apiKeyBroker,
      k8sBroker,
      keys,
      secretValues: [acme.client_secret, globex.client_secret, ...Object.values(keys)],
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
