import type { BrokerProcess } from '../test/support/broker-process';
import { spawnImageBroker } from './paths';
import { startBenchSetup } from './setup';

/** One configuration to load: a running broker, the URL and the caller's credential. */
export interface AuthBenchTarget {
  name: string;
  url: string;
  headers: Record<string, string>;
  /** `POST` with a form body for the token endpoint; `GET` otherwise. */
  method?: 'GET' | 'POST';
  body?: string;
}

const CLIENT_ID = 'bench';
/** The api-key broker with tracing on (see `otlpEndpoint`). */
export const TRACED_TARGET = 'GET /token, api-key caller, tracing on';
const CREDENTIALS = { client_id: 'bench-merchant', client_secret: 'bench-only-secret' };

/**
 * Brokers for `GET /token` under load with caller authentication on, one per mode: `api-key`
 * (hash and constant-time compare on every request) and `kubernetes` (a projected token
 * verified once against a local JWKS, then answered from the verified-token cache).
 *
 * Each mode runs in its own broker process (`node dist/main.js`, memory store, the provider
 * emulator as provider) at LOG_LEVEL=info, so the audit line written per token is part of the
 * measured cost, as in production. The load, the baseline (a bare `node:http` server, measured
 * in the same interleaved rounds) and the ratios are the harness's job.
 */
export async function startAuthBrokers(opts: {
  /** The brokers' LOG_LEVEL; `info` (the default, as in production) writes the audit lines. */
  logLevel?: string;
  /**
   * Also start the api-key broker a second time with OpenTelemetry tracing on, exporting to
   * this OTLP/HTTP endpoint (target named {@link TRACED_TARGET}).
   */
  otlpEndpoint?: string;
}): Promise<{ targets: AuthBenchTarget[]; stop(): Promise<void> }> {
  const setup = await startBenchSetup({
    name: 'auth',
    clientId: CLIENT_ID,
    credentials: CREDENTIALS,
  });
  const brokers: BrokerProcess[] = [];
  const stop = async () => {
    await Promise.all(brokers.map((b) => b.stop()));
    await setup.close();
  };
  try {
    const common = {
      ...setup.env,
      CREDENTIALS_FILE: setup.credentialsFile,
      LOG_LEVEL: opts.logLevel ?? 'info',
    };
    const modes: Array<{ name: string; authorization: string; env: Record<string, string> }> = [
      {
        name: 'GET /token, api-key caller',
        authorization: `Bearer ${setup.apiKey}`,
        env: setup.apiKeyAuth,
      },
      {
        name: 'GET /token, kubernetes caller',
        authorization: `Bearer ${await setup.serviceAccountToken()}`,
        env: setup.kubernetesAuth,
      },
    ];
    if (opts.otlpEndpoint !== undefined) {
      modes.push({
        ...modes[0],
        name: TRACED_TARGET,
        env: {
          ...modes[0].env,
          OTEL_EXPORTER_OTLP_ENDPOINT: opts.otlpEndpoint,
          OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
          OTEL_BSP_SCHEDULE_DELAY: '200',
          OTEL_SERVICE_NAME: 'token-broker-bench',
        },
      });
    }
    const targets: AuthBenchTarget[] = [];
    let apiKeyBroker: BrokerProcess | undefined;
    for (const mode of modes) {
      // `node dist/main.js` (the production bundle, as the image runs it). Its output goes to a
      // file, as a container runtime's log driver would take it: reading it through a pipe
      // here would spend the load generator's CPU and skew the figures.
      const broker = await spawnImageBroker({
        name: `broker (${mode.name})`,
        env: { ...common, ...mode.env },
        outputToFile: true,
      });
      brokers.push(broker);
      await broker.waitReady();
      targets.push({
        name: mode.name,
        url: `${broker.url}/token?client=${CLIENT_ID}`,
        headers: { authorization: mode.authorization },
      });
      if (mode.env.CALLER_AUTH_MODE === 'api-key') apiKeyBroker ??= broker;
    }
    // The stock OAuth client's request to the same api-key broker: Basic id:key, form body.
    targets.push({
      name: 'POST /oauth2/token, api-key caller (client_secret_basic)',
      url: `${apiKeyBroker!.url}/oauth2/token`,
      method: 'POST',
      headers: {
        authorization: `Basic ${Buffer.from(`bench:${setup.apiKey}`).toString('base64')}`,
        'content-type': 'application/x-www-form-urlencoded',
      },
      body: `grant_type=client_credentials&resource=${CLIENT_ID}`,
    });
    return { targets, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
