import type { Logger } from 'pino';
import type { ClientConfig } from '../config/client.schema';
import type { MetricsService } from '../metrics/metrics.service';
import type { TokenGrantor } from '../provider/auth-server.client';
import { ProviderErrorCode, ProviderException } from '../provider/provider.exception';
import type { CredentialsCache } from '../secrets/credentials-cache';
import { type TokenRecord, toRecord, withGeneration } from './token-record';
import type { FleetBus } from './token-store';

interface ProviderFetchDeps {
  store: Pick<FleetBus, 'generation'>;
  grantor: TokenGrantor;
  credentials: CredentialsCache;
  metrics: Pick<MetricsService, 'refreshes' | 'providerLatency'>;
  logger: Logger;
  now: () => number;
}

/**
 * After `invalid_client`, tries each other version of the credentials. Takes no lock: the caller
 * holds it, or the store is down and the caller is the replica's single flight.
 */
export async function fetchFromProvider(
  client: ClientConfig,
  deps: ProviderFetchDeps,
): Promise<TokenRecord> {
  const { grantor, credentials, logger, metrics } = deps;
  const current = await credentials.get();
  const started = deps.now();
  const observe = (statusClass: string) =>
    metrics.providerLatency.labels('token', statusClass).observe((deps.now() - started) / 1000);
  // The generation it is requested in: a revoke arriving meanwhile fences it out.
  const generation = deps.store.generation(client.id);
  try {
    const grant = await grantor.requestToken(client, current);
    observe('2xx');
    metrics.refreshes.labels(client.id, 'fetched').inc();
    const record = withGeneration(toRecord(grant), generation);
    logger.info(
      {
        client: client.id,
        fingerprint: record.fingerprint,
        lifetimeSeconds: grant.lifetimeSeconds,
      },
      'new token obtained from the provider',
    );
    return record;
  } catch (err) {
    const status = err instanceof ProviderException ? err.details.status : undefined;
    observe(status === undefined ? 'none' : `${Math.floor(status / 100)}xx`);
    if (err instanceof ProviderException && err.code === ProviderErrorCode.InvalidClient) {
      // The secret may have changed since read, or a rotation be half done.
      const rotated = await credentials.rotate(
        current,
        (fresh) => grantor.requestToken(client, fresh),
        (e): e is ProviderException =>
          e instanceof ProviderException && e.code === ProviderErrorCode.InvalidClient,
      );
      if (rotated) {
        logger.info(
          { client: client.id, stage: rotated.stage ?? 'current' },
          'credentials refused; the server accepted another version of them',
        );
        metrics.refreshes.labels(client.id, 'fetched').inc();
        return withGeneration(toRecord(rotated.result), generation);
      }
    }
    throw err;
  }
}
