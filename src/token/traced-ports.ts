import type { TokenGrantor } from '../provider/auth-server.client';
import { inLeadSpan, inSpan, spansEnabled } from '../tracing/spans';
import type { RefreshLock, TokenRecords, TokenStore } from './token-store';

/** Without tracing, the store itself; with it, the records and the lock are traced. */
export function tracedTokenStore(store: TokenStore): TokenStore {
  if (!spansEnabled()) return store;
  const records = Object.create(store.records) as TokenRecords;
  records.read = (clientId) =>
    inSpan('token.store.read', { 'token_broker.client': clientId }, () =>
      store.records.read(clientId),
    );
  records.writeFenced = (clientId, record) =>
    inSpan('token.store.write_fenced', { 'token_broker.client': clientId }, async (span) => {
      const written = await store.records.writeFenced(clientId, record);
      span.setAttribute('token_broker.fence.written', written);
      return written;
    });
  const lock = Object.create(store.lock) as RefreshLock;
  // The span is the taking of the lock; the pass run under it is its sibling.
  lock.withRefreshLock = (clientId, fn) =>
    inLeadSpan('token.lock', { 'token_broker.client': clientId }, async (span, leave) => {
      const locked = await store.lock.withRefreshLock(clientId, () => {
        span.setAttribute('token_broker.lock.acquired', true);
        return leave(fn);
      });
      if (!locked.acquired) span.setAttribute('token_broker.lock.acquired', false);
      return locked;
    });
  return { records, lock, bus: store.bus, health: store.health };
}

/** The HTTP call is the span's child. */
export function tracedGrantor(grantor: TokenGrantor): TokenGrantor {
  if (!spansEnabled()) return grantor;
  return {
    requestToken: (client, credentials) =>
      inSpan('provider.token_request', { 'token_broker.client': client.id }, () =>
        grantor.requestToken(client, credentials),
      ),
  };
}
