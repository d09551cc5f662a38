import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import * as tls from 'node:tls';
import { type ClientConfig, presentsCertificate } from '../config/client.schema';
import { describeCredentialsSource, shownReference } from '../config/secret-reference';
import type { ClientCredentials } from '../secrets/client-credentials';
import { ProviderErrorCode, ProviderException } from './provider.exception';
import {
  type Agent,
  CERTIFICATE_ALERT,
  type ClientTlsOptions,
  type TlsSettingNames,
} from './provider-http';

/** The settings a TLS failure of `client`'s connections names. */
export function tlsSettingNames(client: ClientConfig): TlsSettingNames {
  const certificate =
    client.tokenRequest.grant === 'rfc6749' && presentsCertificate(client.tokenRequest.auth)
      ? `the credentials (${describeCredentialsSource(client.credentials)})`
      : undefined;
  const trust =
    client.caFile !== undefined
      ? `Node's CAs and the client's caFile "${shownReference(client.caFile)}"`
      : "Node's CAs and NODE_EXTRA_CA_CERTS (set the client's caFile to trust a private CA)";
  return { ...(certificate !== undefined && { certificate }), trust };
}

/** Node's default CAs (its bundle, `NODE_EXTRA_CA_CERTS`, and the system's if enabled). */
function defaultCas(): readonly string[] {
  const get = (tls as { getCACertificates?: (kind: string) => string[] }).getCACertificates;
  return get?.('default') ?? tls.rootCertificates;
}

/**
 * One undici agent per client, never shared with another client, built from what that client
 * presents (its certificate, for the mutual-TLS methods) and trusts (its `caFile`), and replaced
 * (the old one closed) when either changes. A client with neither uses the shared pool.
 * `purpose` keeps the token endpoint's agents and the API's apart.
 */
export class ClientAgents {
  private readonly agents = new Map<
    string,
    {
      fingerprint: string;
      agent: Agent;
      options: ClientTlsOptions;
      /** What it was built from last: the same objects again need no fingerprint. */
      from: { cert?: string; key?: string; ca?: string };
    }
  >();
  private readonly cas = new Map<string, { pem: string; readAt: number }>();

  /**
   * @param caMaxAgeMs a `caFile` is re-read this often (a rotated mount is picked up).
   */
  constructor(
    private readonly create: (options: ClientTlsOptions) => Agent,
    private readonly caMaxAgeMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * `undefined` when the client needs no agent of its own. Throws a permanent
   * {@link ProviderException} naming the setting when the certificate and key do not belong
   * together or the CA file cannot be read: no connection could succeed.
   */
  agentFor(
    client: ClientConfig,
    credentials: ClientCredentials | undefined,
    what: string,
  ): Agent | undefined {
    const ca = this.caOf(client, what);
    const cert = credentials?.certificate;
    const key = cert !== undefined ? credentials?.privateKey : undefined;
    if (ca === undefined && cert === undefined) return undefined;
    const known = this.agents.get(client.id);
    // The hot path (every API call): the same strings as last time.
    if (known && known.from.cert === cert && known.from.key === key && known.from.ca === ca) {
      return known.agent;
    }
    const fingerprint = createHash('sha256')
      .update(cert ?? '')
      .update('\0')
      .update(key ?? '')
      .update('\0')
      .update(ca ?? '')
      .digest('hex');
    if (known?.fingerprint === fingerprint) {
      known.from = { cert, key, ca };
      return known.agent;
    }
    // One context per agent: built per connection, a CA list costs tens of milliseconds.
    const options: ClientTlsOptions = {
      secureContext: secureContextOf(
        client,
        {
          ...(cert !== undefined && key !== undefined && { cert, key }),
          ...(ca !== undefined && { ca: [...defaultCas(), ca] }),
        },
        what,
      ),
    };
    const agent = this.create(options);
    this.agents.set(client.id, { fingerprint, agent, options, from: { cert, key, ca } });
    // The old pool's connections present the rotated-out certificate.
    if (known) void known.agent.close().catch(() => undefined);
    return agent;
  }

  /** What `client`'s agent presents and trusts, if it has one. */
  optionsOf(clientId: string): ClientTlsOptions | undefined {
    return this.agents.get(clientId)?.options;
  }

  async close(): Promise<void> {
    const agents = [...this.agents.values()].map((a) => a.agent);
    this.agents.clear();
    await Promise.all(agents.map((a) => a.close()));
  }

  private caOf(client: ClientConfig, what: string): string | undefined {
    const file = client.caFile;
    if (file === undefined) return undefined;
    const known = this.cas.get(client.id);
    if (known && this.now() - known.readAt < this.caMaxAgeMs) return known.pem;
    let pem: string;
    try {
      pem = readFileSync(file, 'utf8');
    } catch (cause) {
      // A CA read before is kept through a passing failure (a volume being swapped).
      if (known) return known.pem;
      throw new ProviderException(
        ProviderErrorCode.Misconfigured,
        `${what}: cannot read the client's caFile "${shownReference(file)}" (${(cause as { code?: string }).code ?? 'error'})`,
      );
    }
    this.cas.set(client.id, { pem, readAt: this.now() });
    return pem;
  }
}

/** What undici would only find at the first connection, found at once and named. */
function secureContextOf(
  client: ClientConfig,
  options: { cert?: string; key?: string; ca?: string[] },
  what: string,
): tls.SecureContext {
  try {
    return tls.createSecureContext(options);
  } catch (cause) {
    const code = (cause as { code?: string }).code ?? 'error';
    const names = tlsSettingNames(client);
    // No cause: an OpenSSL message may quote part of the key.
    throw new ProviderException(
      ProviderErrorCode.Misconfigured,
      code === 'ERR_OSSL_X509_KEY_VALUES_MISMATCH' || options.ca === undefined
        ? `${what}: the client certificate and private key in ${names.certificate ?? 'the credentials'} cannot be used together (${code}): the key must be the certificate's own, both PEM`
        : `${what}: the client's caFile "${shownReference(client.caFile ?? '')}" or its certificate and key cannot be used (${code}): the CA file must hold PEM certificates`,
    );
  }
}

/**
 * Whether the server at `url` refuses the client certificate in `options`: one handshake of its
 * own, after a call on it failed with the connection closed before any answer. A TLS 1.3 server
 * judges the certificate after the client thinks the handshake done, and many (Node's among
 * them) then close the connection without an alert the client could read: so a server that
 * sends an alert about the certificate, or closes a connection it just completed before any
 * request, refuses it; one that keeps it open accepted it (and the failure was something else).
 * Returns how it refused, or `undefined`.
 */
export function probeCertificateRefusal(
  url: string,
  options: ClientTlsOptions,
  timeoutMs: number,
): Promise<string | undefined> {
  const u = new URL(url);
  const host = u.hostname.replace(/^\[(.*)\]$/, '$1');
  return new Promise((resolve) => {
    let secured = false;
    let settled = false;
    const socket = tls.connect({
      host,
      port: Number(u.port || 443),
      ...(isIP(host) === 0 && { servername: host }),
      ALPNProtocols: ['http/1.1'],
      ...options,
    });
    const done = (how: string | undefined) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(how);
    };
    const timer = setTimeout(() => done(undefined), timeoutMs);
    socket.once('secureConnect', () => (secured = true));
    socket.on('data', () => done(undefined));
    socket.once('error', (err: Error & { code?: string }) =>
      done(CERTIFICATE_ALERT.test(err.code ?? '') ? err.code : undefined),
    );
    socket.once('close', () =>
      done(secured ? 'it closed the connection right after the handshake' : undefined),
    );
  });
}
