import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ManagedProcess, minimalEnv } from './managed-process';
import { freePort } from './ports';
import { repoRoot } from './repo-root';
import { waitFor } from './wait';

/** One client registered at the authorization server (oidc-provider client metadata). */
export type AuthServerClientMetadata = Record<string, unknown> & { client_id: string };

/** Options for {@link startAuthServer}. */
export interface AuthServerOptions {
  clients: AuthServerClientMetadata[];
  /** Access token lifetime (`ttl.ClientCredentials`). @default 60 */
  ttlSeconds?: number;
  /** Scopes the server knows. @default ['orders'] */
  scopes?: string[];
  /** Resource indicators it issues JWT access tokens for. @default [RESOURCE] */
  resources?: string[];
  /** Serve https, asking for (and verifying against `clientCa`) a client certificate: PEM files. */
  tls?: { key: string; cert: string; clientCa: string };
  /** DPoP (RFC 9449) on, every proof needing a server nonce (see {@link AuthServer.rotateDpopNonce}). */
  dpop?: boolean;
  /**
   * With `tls`: bind access tokens to the client certificate (RFC 8705 §3,
   * `features.mTLS.certificateBoundAccessTokens`). @default false
   */
  certificateBoundAccessTokens?: boolean;
  /**
   * With `tls`: the issuer's listener asks for no client certificate; a second one that does is
   * published as `mtls_endpoint_aliases.token_endpoint` (RFC 8705 §5). @default false
   */
  mtlsAlias?: boolean;
  /**
   * The client authentication methods it supports (and publishes), `self_signed_tls_client_auth`
   * among them turning `features.mTLS.selfSignedTlsClientAuth` on.
   * @default client_secret_basic, client_secret_post, private_key_jwt, and with `tls` tls_client_auth
   */
  clientAuthMethods?: string[];
}

/** The resource indicator the helper registers by default. */
export const RESOURCE = 'https://orders.example.test';

/** What the authorization server logged about one token request. */
export interface GrantEvent {
  event: 'grant' | 'grant_error';
  client?: string;
  error?: string;
  /** The subject CN of the client certificate presented on the connection, if any. */
  certificate?: string | null;
  at: number;
}

/** A running oidc-provider process. */
export interface AuthServer {
  /** The issuer, `http(s)://127.0.0.1:<port>`. */
  readonly url: string;
  /** Its token endpoint. */
  readonly tokenUrl: string;
  /** Its JWKS (`/jwks`): the keys its JWT access tokens are signed with. */
  readonly jwksUrl: string;
  /** With `dpop`: a fresh nonce secret, so every nonce handed out so far is refused. */
  rotateDpopNonce(): Promise<void>;
  /** Every token request so far, successful or not, oldest first. */
  grants(): GrantEvent[];
  logs(): string[];
  stop(): Promise<void>;
}

/**
 * Starts panva's oidc-provider (test/support/oidc-provider.mjs) with client-credentials
 * clients, on a free port on 127.0.0.1, and resolves once it listens. A process of its own:
 * oidc-provider is ESM only, which Jest's CommonJS cannot load.
 */
export async function startAuthServer(opts: AuthServerOptions): Promise<AuthServer> {
  const port = await freePort();
  const mtlsAliasPort = opts.mtlsAlias ? await freePort() : undefined;
  const dir = mkdtempSync(join(tmpdir(), 'tb-oidc-'));
  const settingsFile = join(dir, 'settings.json');
  writeFileSync(
    settingsFile,
    JSON.stringify({
      port,
      ttlSeconds: opts.ttlSeconds ?? 60,
      scopes: opts.scopes ?? ['orders'],
      resources: opts.resources ?? [RESOURCE],
      tls: opts.tls,
      dpop: opts.dpop ?? false,
      certificateBoundAccessTokens: opts.certificateBoundAccessTokens,
      mtlsAliasPort,
      clientAuthMethods: opts.clientAuthMethods,
      clients: opts.clients.map((c) => ({
        grant_types: ['client_credentials'],
        redirect_uris: [],
        response_types: [],
        ...c,
      })),
    }),
  );
  const proc = ManagedProcess.start({
    name: `oidc-provider:${port}`,
    command: process.execPath,
    args: [join(repoRoot(), 'test/support/oidc-provider.mjs'), settingsFile],
    env: minimalEnv(),
    cwd: repoRoot(),
    // Its settings, removed when it exits.
    dir,
  });
  const exited = new AbortController();
  void proc.exited.then(() => exited.abort(new Error('exited')));
  let url: string;
  try {
    url = await waitFor(
      () =>
        proc
          .logs()
          .find((l) => l.startsWith('READY '))
          ?.slice('READY '.length),
      { timeoutMs: 15_000, what: 'oidc-provider to listen', signal: exited.signal },
    );
  } catch (err) {
    await proc.stop();
    throw new Error(`oidc-provider did not start; its output:\n${proc.logs().join('\n')}`, {
      cause: err,
    });
  }
  return {
    url,
    tokenUrl: `${url}/token`,
    jwksUrl: `${url}/jwks`,
    async rotateDpopNonce() {
      const res = await fetch(`${url}/__test/rotate-dpop-nonce`, { method: 'POST' });
      if (res.status !== 204) throw new Error(`nonce rotation answered ${res.status}`);
    },
    grants: () =>
      proc
        .logs()
        .filter((l) => l.startsWith('{"event":'))
        .map((l) => JSON.parse(l) as GrantEvent),
    logs: () => proc.logs(),
    async stop() {
      await proc.stop();
    },
  };
}

/**
 * Asks the server's introspection endpoint about `token`, authenticating as a
 * client_secret_basic client; `{active: false}` for a token it did not issue or that expired.
 * `ca`: the PEM to trust an https server by.
 */
export async function introspect(
  server: AuthServer,
  token: string,
  as: { id: string; secret: string },
  ca?: string,
): Promise<Record<string, unknown>> {
  const body = new URLSearchParams({ token }).toString();
  const url = new URL(`${server.url}/token/introspection`);
  const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
  const text = await new Promise<string>((resolve, reject) => {
    const req = send(
      url,
      {
        method: 'POST',
        agent: false,
        ...(ca !== undefined && { ca: readFileSync(ca) }),
        headers: {
          authorization: `Basic ${Buffer.from(`${as.id}:${as.secret}`).toString('base64')}`,
          'content-type': 'application/x-www-form-urlencoded',
        },
      },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (data += c));
        res.on('end', () =>
          res.statusCode === 200
            ? resolve(data)
            : reject(new Error(`introspection answered ${res.statusCode}`)),
        );
      },
    );
    req.once('error', reject);
    req.end(body);
  });
  return JSON.parse(text) as Record<string, unknown>;
}
