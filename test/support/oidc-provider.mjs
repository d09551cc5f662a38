// A real OAuth 2.0 authorization server for the standard token request profiles: panva's
// oidc-provider, run in its own process because it is ESM only and Jest runs CommonJS.
// Usage: node oidc-provider.mjs <settings.json>. Prints `READY <issuer>` once listening, and one
// JSON line per token request (`{"event":"grant",...}` or `{"event":"grant_error",...}`) so
// the test can count what the fleet asked for. With `settings.dpop`, DPoP (RFC 9449) is on and
// every proof must carry a server nonce; `POST /__test/rotate-dpop-nonce` switches to a fresh
// nonce secret at once (a rotation: every nonce handed out so far is refused).
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { X509Certificate } from 'node:crypto';
import Provider from 'oidc-provider';

const settings = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const scheme = settings.tls ? 'https' : 'http';
const issuer = `${scheme}://127.0.0.1:${settings.port}`;
// RFC 8705 §5: a second listener that asks for client certificates, published as the mTLS
// alias of the token endpoint; the issuer's own listener then asks for none.
const alias =
  settings.tls && settings.mtlsAliasPort
    ? `https://127.0.0.1:${settings.mtlsAliasPort}`
    : undefined;

// One key set for every instance: a token issued before a nonce rotation still verifies. RS256
// first: it signs what no client asked otherwise for (id tokens, JWT access tokens).
const signingKeys = [
  {
    ...generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' }),
    kid: 'as-rs',
    alg: 'RS256',
    use: 'sig',
  },
  {
    ...generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'jwk' }),
    kid: 'as-es',
    alg: 'ES256',
    use: 'sig',
  },
];

const makeProvider = (nonceSecret) =>
  new Provider(issuer, {
    jwks: { keys: signingKeys },
    clients: settings.clients,
    clientAuthMethods: settings.clientAuthMethods ?? [
      'client_secret_basic',
      'client_secret_post',
      'private_key_jwt',
      ...(settings.tls ? ['tls_client_auth'] : []),
    ],
    ...(alias && { discovery: { mtls_endpoint_aliases: { token_endpoint: `${alias}/token` } } }),
    features: {
      devInteractions: { enabled: false },
      dPoP: settings.dpop
        ? { enabled: true, nonceSecret, requireNonce: () => true }
        : { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // A client that names no resource gets an opaque token for the server itself.
        defaultResource: (_ctx, _client, oneOf) => oneOf,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource) => {
          if (!settings.resources.includes(resource)) throw new Provider.errors.InvalidTarget();
          return {
            scope: settings.scopes.join(' '),
            audience: resource,
            accessTokenTTL: settings.ttlSeconds,
            accessTokenFormat: 'jwt',
          };
        },
      },
      mTLS: {
        enabled: Boolean(settings.tls),
        tlsClientAuth: true,
        selfSignedTlsClientAuth: Boolean(
          settings.clientAuthMethods?.includes('self_signed_tls_client_auth'),
        ),
        certificateBoundAccessTokens: Boolean(settings.certificateBoundAccessTokens),
        getCertificate: (ctx) => {
          const peer = ctx.req.socket.getPeerCertificate?.();
          return peer?.raw ? new X509Certificate(peer.raw).toString() : undefined;
        },
        certificateAuthorized: (ctx) => ctx.req.socket.authorized === true,
        certificateSubjectMatches: (ctx, property, expected) =>
          property === 'tls_client_auth_subject_dn' &&
          `CN=${ctx.req.socket.getPeerCertificate().subject.CN}` === expected,
      },
    },
    scopes: settings.scopes,
    ttl: { ClientCredentials: settings.ttlSeconds },
  });
// The memory adapter is the module's: every instance shares grants and replay detection.
let provider = makeProvider(randomBytes(32));
provider.proxy = false;

const log = (event) => process.stdout.write(`${JSON.stringify({ ...event, at: Date.now() })}\n`);
// Which certificate the connection presented: a mutual-TLS client's must go to its token
// endpoint only.
const certificate = (ctx) => ctx.req.socket.getPeerCertificate?.()?.subject?.CN ?? null;
const listen = (instance) => {
  instance.on('grant.success', (ctx) => {
    log({
      event: 'grant',
      client: ctx.oidc.client?.clientId,
      certificate: certificate(ctx),
    });
  });
  instance.on('grant.error', (ctx, err) => {
    log({
      event: 'grant_error',
      client: ctx.oidc.client?.clientId,
      error: err.error ?? err.name,
      certificate: certificate(ctx),
    });
  });
};
listen(provider);

const callbacks = new Map([[provider, provider.callback()]]);
const callback = (req, res) => {
  if (settings.dpop && req.method === 'POST' && req.url === '/__test/rotate-dpop-nonce') {
    provider = makeProvider(randomBytes(32));
    provider.proxy = false;
    listen(provider);
    callbacks.set(provider, provider.callback());
    log({ event: 'nonce_rotated' });
    res.writeHead(204).end();
    return;
  }
  return callbacks.get(provider)(req, res);
};
const tlsOptions = (requestCert) =>
  settings.tls && {
    key: readFileSync(settings.tls.key),
    cert: readFileSync(settings.tls.cert),
    ca: readFileSync(settings.tls.clientCa),
    requestCert,
    rejectUnauthorized: false,
  };
if (alias)
  createHttpsServer(tlsOptions(true), callback).listen(settings.mtlsAliasPort, '127.0.0.1');
const server = settings.tls
  ? createHttpsServer(
      {
        key: readFileSync(settings.tls.key),
        cert: readFileSync(settings.tls.cert),
        ca: readFileSync(settings.tls.clientCa),
        requestCert: !alias,
        // oidc-provider decides per client: tls_client_auth needs a verified certificate,
        // the other methods none.
        rejectUnauthorized: false,
      },
      callback,
    )
  : createHttpServer(callback);
server.listen(settings.port, '127.0.0.1', () => process.stdout.write(`READY ${issuer}\n`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
