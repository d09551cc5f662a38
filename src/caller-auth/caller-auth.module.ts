import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import type { Logger } from 'pino';
import { CALLER_SCOPES } from '../config/caller-auth.schema';
import { BROKER_CONFIG } from '../config/config.constants';
import { CONFIG_RELOADER, type ConfigReloader } from '../config/config-reload';
import type { BrokerConfig } from '../config/config.schema';
import { describeCredentialsSource } from '../config/secret-reference';
import { LOGGER } from '../logging/logger';
import { SECRET_READER, type SecretReader } from '../secrets/secret-reader';
import { SecretsModule } from '../secrets/secrets.module';
import { ApiKeyAuthenticator } from './api-key.authenticator';
import { loadApiKeyGrants } from './api-key-grants.loader';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from './caller';

/** Every route but health, metrics and the OpenAPI document. */
@Module({
  imports: [SecretsModule],
  providers: [
    {
      provide: CALLER_AUTHENTICATOR,
      inject: [BROKER_CONFIG, SECRET_READER, LOGGER, { token: CONFIG_RELOADER, optional: true }],
      useFactory: createCallerAuthenticator,
    },
  ],
  exports: [CALLER_AUTHENTICATOR],
})
export class CallerAuthModule implements OnApplicationShutdown {
  constructor(@Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator) {}

  onApplicationShutdown(): void {
    this.auth.close?.();
  }
}

/** Mode `none` (development only): every request is this caller. */
const ANONYMOUS: Caller = { name: 'anonymous', clients: '*', scopes: new Set(CALLER_SCOPES) };

/** Fails start-up if the keys cannot be read. */
async function createCallerAuthenticator(
  config: BrokerConfig,
  secrets: SecretReader,
  rootLogger: Logger,
  reloader?: ConfigReloader,
): Promise<CallerAuthenticator> {
  // A reload re-reads the grants of the configuration in force, which name its clients; one
  // that switches the mode waits for the restart it needs, keeping the grants of this mode.
  const current = () => {
    const live = reloader?.current ?? config;
    return live.callerAuth.mode === config.callerAuth.mode ? live : config;
  };
  const logger = rootLogger.child({ component: 'caller-auth' });
  switch (config.callerAuth.mode) {
    case 'none':
      logger.warn(
        { mode: 'none', host: config.http.host },
        `CALLER AUTHENTICATION IS OFF (CALLER_AUTH_MODE=none): anyone who can reach ${config.http.host}:${config.http.port} can take the merchants' tokens. Local development only.`,
      );
      return { authenticate: () => ANONYMOUS };
    case 'api-key':
      return createApiKeyAuthenticator(config, secrets, logger, current);
    case 'kubernetes':
      return createKubernetesAuthenticator(config, logger, current);
  }
}

async function createApiKeyAuthenticator(
  config: BrokerConfig,
  secrets: SecretReader,
  logger: Logger,
  current: () => BrokerConfig,
): Promise<ApiKeyAuthenticator> {
  const { apiKeys = [], apiKeysSource, apiKeysReloadSeconds } = config.callerAuth;
  const load = async () => {
    const live = current();
    const known = new Set(live.clients.map((c) => c.id));
    return [
      ...(live.callerAuth.apiKeys ?? []),
      ...(apiKeysSource ? await loadApiKeyGrants(secrets, apiKeysSource, known) : []),
    ];
  };
  // The admin reload (POST /admin/reload) re-reads the source even with the timer off, and the
  // config file's own keys, which a reload of it may have changed.
  const auth = new ApiKeyAuthenticator(await load(), load);
  if (apiKeysSource && apiKeysReloadSeconds > 0) {
    auth.reloadEvery(apiKeysReloadSeconds * 1000, (result) => {
      if ('error' in result) {
        logger.error(
          { err: result.error },
          'reloading API keys failed; keeping the keys already loaded',
        );
      } else {
        logger.info(result.changed, 'API keys reloaded');
      }
    });
  }
  const inlineCallers = [...new Set(apiKeys.map((k) => k.name))];
  logger.info(
    {
      mode: 'api-key',
      keyCount: auth.size,
      inlineCallers,
      source: apiKeysSource && describeCredentialsSource(apiKeysSource),
    },
    'caller authentication: API keys',
  );
  if (auth.size === 0) logger.warn('no API keys are configured: every caller will get 401');
  return auth;
}

async function createKubernetesAuthenticator(
  config: BrokerConfig,
  logger: Logger,
  current: () => BrokerConfig,
): Promise<CallerAuthenticator> {
  // The JWT stack loads in this mode only: the other modes should not pay its memory and start-up.
  const [{ KubernetesAuthenticator }, { remoteServiceAccountKeys }] = await Promise.all([
    import('./kubernetes.authenticator'),
    import('./service-account-keys'),
  ]);
  const settings = config.callerAuth.kubernetes;
  const jwksUrl = settings.jwksUrl!;
  const keys = remoteServiceAccountKeys(jwksUrl, {
    onFetchFailure: (err) =>
      logger.warn(
        { err, jwksUrl },
        'fetching the cluster signing keys (JWKS) failed; service-account tokens not seen before get 503 until it works. Check callerAuth.kubernetes.jwksUrl and that the broker may read it',
      ),
  });
  // Not fatal: the API server may be briefly unreachable; tokens are checked once it answers.
  keys.warmUp().catch(() => undefined);
  logger.info(
    {
      mode: 'kubernetes',
      jwksUrl,
      issuer: settings.issuer,
      audience: settings.audience,
      subjects: Object.keys(settings.subjects),
    },
    'caller authentication: Kubernetes service-account tokens',
  );
  return new KubernetesAuthenticator({
    ...settings,
    issuer: settings.issuer!,
    getKey: keys.getKey,
    currentSubjects: () => current().callerAuth.kubernetes.subjects,
  });
}
