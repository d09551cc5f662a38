import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBrokerApp } from '../src/bootstrap';
import { loadConfig } from '../src/config/config.loader';
import { ProviderEmulator } from '../emulator/provider-emulator';
import { createLogger } from '../src/logging/logger';

/** The sandbox's one caller: its name is the client id on `/oauth2/token`. */
const CALLER = 'sandbox-caller';

/**
 * `npm run sandbox`: the broker plus a local provider emulator, nothing else to install or
 * configure. In-memory store (no Redis), loopback only, and callers authenticate as in
 * production: one API key, made at start and printed, so every printed command shows how a
 * calling service presents its credential.
 */
async function main(): Promise<void> {
  const credentials = { client_id: 'sandbox-merchant', client_secret: 'sandbox-only-secret' };
  const dir = mkdtempSync(join(tmpdir(), 'token-broker-sandbox-'));
  // Every way out, a failed start included: the folder holds the credentials and key hashes.
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  const emulator = await ProviderEmulator.start({
    credentials: { [credentials.client_id]: credentials.client_secret },
  });
  const credentialsFile = join(dir, 'credentials.json');
  writeFileSync(credentialsFile, JSON.stringify(credentials), { mode: 0o600 });
  // Hex: no `+`, `/` or `=`, so the key works as written in `curl -u` (Basic credentials are
  // form-decoded on /oauth2/token).
  const callerKey = randomBytes(32).toString('hex');
  const apiKeysFile = join(dir, 'api-keys.json');
  const sha256 = createHash('sha256').update(callerKey).digest('hex');
  const grant = {
    name: CALLER,
    sha256,
    clients: ['sandbox'],
    scopes: ['token', 'forward', 'admin'],
  };
  writeFileSync(apiKeysFile, JSON.stringify([grant]), { mode: 0o600 });

  const port = process.env.PORT ?? '8080';
  const config = loadConfig({
    // A local tool, so development, asked for by name: unset means production.
    NODE_ENV: 'development',
    PORT: port,
    HOST: '127.0.0.1',
    // Warnings and errors only, so the key block is what a newcomer sees; LOG_LEVEL=info shows
    // the broker's start-up and refresh lines.
    LOG_LEVEL: process.env.LOG_LEVEL ?? 'warn',
    CLIENT_ID: 'sandbox',
    PROVIDER_AUTH_URL: emulator.url,
    PROVIDER_BASE_URL: emulator.url,
    CREDENTIALS_FILE: credentialsFile,
    CALLER_AUTH_MODE: 'api-key',
    CALLER_API_KEYS_FILE: apiKeysFile,
  });
  const logger = createLogger(config.log.level);
  const app = await createBrokerApp(config, logger);
  try {
    await app.listen({ port: config.http.port, host: config.http.host });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    throw new Error(
      `port ${config.http.port} on 127.0.0.1 is taken; pick a free one: PORT=8081 npm run sandbox`,
      { cause: err },
    );
  }
  const base = `http://127.0.0.1:${config.http.port}`;
  const auth = '-H "Authorization: Bearer $CALLER_KEY"';
  const client =
    "require('@token-broker/client').createBrokerClient({ baseUrl: '" +
    base +
    "', apiKey: process.env.CALLER_KEY }).getToken({ client: 'sandbox', minTtl: 60 }).then((t) => console.log(t.tokenType, t.expiresAt))";
  process.stdout.write(
    [
      '',
      `Token broker sandbox on ${base} (provider emulator on ${emulator.url})`,
      '',
      'Your caller key (made at start; paste this line first):',
      '',
      `  export CALLER_KEY=${callerKey}`,
      '',
      `  curl -s ${auth} '${base}/token?min_ttl=60'`,
      `  curl -s -u "${CALLER}:$CALLER_KEY" -d grant_type=client_credentials ${base}/oauth2/token`,
      `  node -e "${client}"`,
      `  curl -s -X POST ${base}/orders ${auth} -H 'Content-Type: application/json' \\`,
      `       -H 'Idempotency-Key: order-0001' -d '{"price": 1200, "localization": {"currency": "USD"}}'`,
      `  curl -s ${auth} '${base}/provider/sandbox/api/marketing/v1/offers?amount=500'`,
      `  curl -s ${base}/health/ready`,
      `  curl -s ${base}/metrics   # no key: open in development (docs/security.md)`,
      `  curl -s ${auth} ${base}/admin/clients            # operators: docs/operations.md`,
      '',
      'Ctrl-C to stop.',
      '',
    ].join('\n'),
  );

  const stop = async () => {
    await app.close();
    await emulator.close();
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
