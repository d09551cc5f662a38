import type { Dispatcher } from 'undici';
import type { ClientConfig } from '../config/client.schema';
import type { ProviderSettings } from '../config/config.schema';
import type { ClientCredentials, SecretCredentials } from '../secrets/client-credentials';
import { postTokenRequest } from './provider-http';
import type { GrantedToken } from './token-response.parser';

/**
 * The provider's token endpoint path, appended to a client's `authUrl` (`{auth_url}`): with
 * `authUrl: https://partner.upgrade.com` the broker requests
 * `https://partner.upgrade.com/api/auth/v1/oauth/token`.
 */
export const TOKEN_PATH = '/api/auth/v1/oauth/token';

/** The provider's token endpoint, as the token service sees it. */
export interface TokenGrantor {
  /** Requests a new token for a client. Throws {@link ProviderException}. */
  requestToken(client: ClientConfig, credentials: ClientCredentials): Promise<GrantedToken>;
}

/**
 * Client-credentials grant exactly as the provider documents it: `POST` with `grant_type` in the
 * **query string**, HTTP Basic client authentication and no body. Stock OAuth clients send
 * the grant in a form body, which this provider does not document, so this is hand-written.
 */
export class AuthServerClient implements TokenGrantor {
  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly settings: ProviderSettings,
    private readonly defaultLifetimeSeconds: number,
    private readonly now: () => number = Date.now,
  ) {}

  async requestToken(client: ClientConfig, credentials: SecretCredentials): Promise<GrantedToken> {
    const what = `token request for client "${client.id}"`;
    const url = new URL(`${client.authUrl}${TOKEN_PATH}`);
    url.searchParams.set('grant_type', 'client_credentials');
    // RFC 6749 §2.3.1: id and secret are form-urlencoded before Basic encoding.
    const basic = Buffer.from(
      `${encodeURIComponent(credentials.clientId)}:${encodeURIComponent(credentials.clientSecret)}`,
    ).toString('base64');

    return postTokenRequest({
      dispatcher: this.dispatcher,
      url,
      headers: { authorization: `Basic ${basic}`, accept: 'application/json' },
      settings: this.settings,
      defaultLifetimeSeconds: this.defaultLifetimeSeconds,
      // Expiry counts from *before* the request: the provider's clock started no earlier.
      sentAt: this.now(),
      what,
      check: 'the client id/secret for this merchant and environment',
    });
  }
}
