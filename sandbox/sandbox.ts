import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBrokerApp } from '../src/bootstrap';
import { loadConfig } from '../src/config/config.loader';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { createLogger } from '../src/logging/logger';

/**
 * `npm run sandbox`: the broker plus a local provider emulator, nothing else to install or
 * configure. In-memory store (no Redis), caller authentication off, loopback only.
 */
async function main(): Promise<void> {
  const credentials = { client_id: 'sandbox-merchant', client_secret: 'sandbox-only-secret' };
  const emulator = await ProviderEmulator.start({
    credentials: { [credentials.client_id]: credentials.client_secret },
  });
  const dir = mkdtempSync(join(tmpdir(), 'token-broker-sandbox-'));
  const credentialsFile = join(dir, 'credentials.json');
  writeFileSync(credentialsFile, JSON.stringify(credentials), { mode: 0o600 });

  const port = process.env.PORT ?? '8080';
  const config = loadConfig({
    PORT: port,
    HOST: '127.0.0.1',
    LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
    CLIENT_ID: 'sandbox',
    PROVIDER_AUTH_URL: emulator.url,
    PROVIDER_BASE_URL: emulator.url,
    CREDENTIALS_FILE: credentialsFile,
    CALLER_AUTH_MODE: 'none',
    CALLER_AUTH_ALLOW_NONE: 'true',
  });
  const logger = createLogger(config.log.level);
  const app = await createBrokerApp(config, logger);
  await app.listen({ port: config.http.port, host: config.http.host });
  const base = `http://127.0.0.1:${config.http.port}`;
  process.stdout.write(
    [
      '',
      `Token broker sandbox on ${base} (provider emulator on ${emulator.url})`,
      '',
      `  curl -s '${base}/token?min_ttl=60'`,
      `  curl -s -d grant_type=client_credentials ${base}/oauth2/token`,
      `  curl -s -X POST ${base}/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-0001' \\`,
      `       -d '{"price": 1200, "localization": {"currency": "USD"}}'`,
      `  curl -s '${base}/provider/sandbox/api/marketing/v1/offers?amount=500'   # any provider call`,
      `  curl -s ${base}/health/ready`,
      `  curl -s ${base}/metrics | grep token_broker_`,
      `  curl -s ${base}/admin/clients                                        # operators (docs/operations.md)`,
      `  curl -s -X POST ${base}/admin/clients/sandbox/refresh`,
      `  curl -s -X POST ${base}/admin/clients/sandbox/revoke`,
      '',
      'Caller authentication is off (mode "none", loopback only). Ctrl-C to stop.',
      '',
    ].join('\n'),
  );

  const stop = async () => {
    await app.close();
    await emulator.close();
    rmSync(dir, { recursive: true, force: true });
    process.exit(0);
  };
  process.once('SIGINT', () => void stop());
  process.once('SIGTERM', () => void stop());
}

main().catch((err: unknown) => {
  process.stderr.write(
    `sandbox failed to start: ${err instanceof Error ? err.message : String(err)}\n`,
  );
  process.exit(1);
});
