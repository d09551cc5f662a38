import type { ClientConfig } from '../config/client.schema';
import type { ClientCredentials } from '../secrets/client-credentials';
import type { AuthServerClient, TokenGrantor } from './auth-server.client';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import type { StandardTokenClient } from './standard-token.client';
import type { GrantedToken } from './token-response.parser';

/** By `tokenRequest.grant`. */
export class TokenGrantorRouter implements TokenGrantor {
  constructor(
    private readonly providerQuery: AuthServerClient,
    private readonly standard: StandardTokenClient,
  ) {}

  async requestToken(client: ClientConfig, credentials: ClientCredentials): Promise<GrantedToken> {
    if (client.tokenRequest.grant === 'rfc6749') {
      return this.standard.requestToken(client, credentials);
    }
    const { clientSecret } = credentials;
    if (clientSecret === undefined) {
      // The credentials loader refuses this for client_secret_basic; a wiring error otherwise.
      throw new ProviderException(
        ProviderErrorCode.Rejected,
        `token request for client "${client.id}": the credentials lack client_secret`,
      );
    }
    return this.providerQuery.requestToken(client, { ...credentials, clientSecret });
  }
}
