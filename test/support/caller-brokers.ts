import type { ProviderEmulator, ProviderKnobs } from '../../emulator/provider-emulator';
import type { SecretsManagerEmulator } from '../../emulator/secrets-manager-emulator';
import type { ServiceAccountIssuer } from '../../emulator/service-account-issuer';
import type { BrokerProcess } from './broker-process';
import { newKey, sha256, startStack } from './stack';

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
 * The set-up the caller-facing e2e tests share, on {@link startStack}: a provider emulator
 * knowing two merchants (`acme-prod`, `globex-prod`) and refusing a third (`initech-prod`), their
 * secrets and the callers' API-key hashes in a Secrets Manager emulator, a service-account
 * issuer, and real brokers (`node dist/main.js`, run `npm run build` first) with the in-memory
 * token store. With `initech-prod`, readiness is polled on the two working clients (GET /token
 * answering 200), not /health/ready: initech-prod never gets a token, by design.
 */
export async function startCallerBrokers(opts: CallerBrokersOptions): Promise<CallerBrokers> {
  const callers = opts.callers ?? { checkout: ['acme-prod'], ops: ['*'] };
  const stack = await startStack({
    name: opts.name,
    clients: [
      ...CALLER_CLIENTS,
      ...((opts.unavailableClient ?? true) ? [{ id: UNAVAILABLE_CLIENT, refused: true }] : []),
    ],
    secrets: 'secrets-manager',
    callerAuth: {
      mode: 'api-key',
      callers: Object.fromEntries(
        Object.entries(callers).map(([name, clients]) => [
          name,
          { clients, scopes: opts.callerScopes?.[name] },
        ]),
      ),
      subjects: opts.subjects ?? { [CHECKOUT_SA]: ['acme-prod'], [OPS_SA]: ['*'] },
    },
    knobs: opts.knobs,
    env: opts.env,
  });
  try {
    const k8sBroker = opts.kubernetes
      ? await stack.addBroker({
          name: `${opts.name}-k8s-broker`,
          env: { CALLER_AUTH_MODE: 'kubernetes', CALLER_API_KEYS_SECRET_ID: undefined },
        })
      : undefined;
    return {
      provider: stack.provider,
      secrets: stack.secrets!,
      issuer: stack.issuer!,
      apiKeyBroker: stack.broker.process!,
      k8sBroker: k8sBroker?.process,
      keys: stack.keys,
      secretValues: stack.secretValues,
      stop: () => stack.close(),
    };
  } catch (err) {
    await stack.close();
    throw err;
  }
}
