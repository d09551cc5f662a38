import type { Dispatcher } from 'undici';
import type { ClientConfig } from '../config/client.schema';
import type { ProviderSettings } from '../config/config.schema';
import type { ClientCredentials, SecretCredentials } from '../secrets/client-credentials';
import { postTokenRequest } from './provider-http';
import type { GrantedToken } from './token-response.parser';

/** Appended to a client's `authUrl`. */
const TOKEN_PATH = '/api/auth/v1/oauth/token';

export interface TokenGrantor {
  /** Throws {@link ProviderException}. */
  requestToken(client: ClientConfig, credentials: ClientCredentials): Promise<GrantedToken>;
}

/**
 * `grant_type` in the **query string**, Basic authentication and no body, as the provider
 * documents it: stock OAuth clients send a form body, hence hand-written.
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
