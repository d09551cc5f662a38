import type { TokenGrantor } from '../provider/auth-server.client';
import { inLeadSpan, inSpan, spansEnabled } from '../tracing/spans';
import type { TokenStore } from './token-store';

/** Without tracing, the ports themselves. */
export function tracedTokenStore(store: TokenStore): TokenStore {
  if (!spansEnabled()) return store;
  const traced = Object.create(store) as TokenStore;
  traced.read = (clientId) =>
    inSpan('token.store.read', { 'token_broker.client': clientId }, () => store.read(clientId));
  // The span is the taking of the lock; the pass run under it is its sibling.
  traced.withRefreshLock = (clientId, fn) =>
    inLeadSpan('token.lock', { 'token_broker.client': clientId }, async (span, leave) => {
      const locked = await store.withRefreshLock(clientId, () => {
        span.setAttribute('token_broker.lock.acquired', true);
        return leave(fn);
      });
      if (!locked.acquired) span.setAttribute('token_broker.lock.acquired', false);
      return locked;
    });
  traced.writeFenced = (clientId, record) =>
    inSpan('token.store.write_fenced', { 'token_broker.client': clientId }, async (span) => {
      const written = await store.writeFenced(clientId, record);
      span.setAttribute('token_broker.fence.written', written);
      return written;
    });
  return traced;
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
