import { createHash, randomUUID } from 'node:crypto';
import type { ClientConfig } from '../config/client.schema';
import type { SecretReader } from '../secrets/secret-reader';
import { shownReference } from '../config/secret-reference';
import { type DpopKey, dpopKeyOf, generateDpopJwk } from './dpop-key';
import { DpopKeyError, type DpopStore, type NonceServer } from './dpop-store';

export { DpopKeyError } from './dpop-store';

/** What a proof covers besides the key: RFC 9449 §4.2. */
export interface ProofTarget {
  readonly method: string;
  /** The request URL; its query and fragment are left out of `htu`. */
  readonly url: string | URL;
  /** For a resource request: `ath`, the token's SHA-256. */
  readonly accessToken?: string;
  /** Which server's nonce to include: its `DPoP-Nonce`, learnt per origin. */
  readonly server: NonceServer;
}

/** The port the provider adapters sign with. */
export interface DpopSigner {
  /** A fresh proof (new `jti`, `iat` now), with the server's nonce if one is known. */
  proof(client: ClientConfig, target: ProofTarget): Promise<string>;
  /** A `DPoP-Nonce` a server answered: shared with the fleet for the next proofs. */
  learn(client: ClientConfig, server: NonceServer, url: string | URL, nonce: string): Promise<void>;
  /** RFC 7638 thumbprint of the client's key: the `cnf.jkt` its tokens are bound to. */
  thumbprint(client: ClientConfig): Promise<string>;
}

export const DPOP_SIGNER = 'TOKEN_BROKER:DPOP_SIGNER';

/** A nonce read from the fleet's store is reused this long before it is read again. */
const LOCAL_NONCE_MS = 1000;

/** RFC 9449 §4.2: `htu` is the URI without query and fragment. */
export function htuOf(url: string | URL): string {
  const u = new URL(url);
  return `${u.origin}${u.pathname}`;
}

/** RFC 9449 §4.2: `ath`, base64url of the SHA-256 of the ASCII access token. */
export function athOf(accessToken: string): string {
  return createHash('sha256').update(accessToken, 'ascii').digest('base64url');
}

/** A `DPoP-Nonce` as RFC 9449 §8.1 allows it (NQCHAR), else undefined. */
export function nonceOf(header: string | string[] | undefined): string | undefined {
  const value = Array.isArray(header) ? header[0] : header;
  return value !== undefined && /^[\x21\x23-\x5b\x5d-\x7e]{1,512}$/.test(value) ? value : undefined;
}

/**
 * Signs every proof of the fleet's DPoP clients: one key per client (read from Secrets Manager
 * or a file, or generated once and kept in the store), the servers' nonces learnt and shared
 * through the store. Holds the keys in memory only.
 */
export class DpopProofs implements DpopSigner {
  private readonly keys = new Map<string, Promise<DpopKey>>();
  private readonly nonces = new Map<string, { nonce: string | undefined; readAt: number }>();

  constructor(
    private readonly secrets: SecretReader,
    private readonly store: DpopStore,
    private readonly now: () => number = Date.now,
  ) {}

  async proof(client: ClientConfig, target: ProofTarget): Promise<string> {
    const key = await this.keyOf(client);
    const url = new URL(target.url);
    const nonce = await this.nonce(client, target.server, url.origin);
    const { SignJWT } = await import('jose');
    return new SignJWT({
      htm: target.method,
      htu: `${url.origin}${url.pathname}`,
      ...(target.accessToken !== undefined && { ath: athOf(target.accessToken) }),
      ...(nonce !== undefined && { nonce }),
    })
      .setProtectedHeader({ alg: key.alg, typ: 'dpop+jwt', jwk: { ...key.publicJwk } })
      .setIssuedAt(Math.floor(this.now() / 1000))
      .setJti(randomUUID())
      .sign(key.privateKey);
  }

  async learn(client: ClientConfig, server: NonceServer, url: string | URL, nonce: string) {
    const origin = new URL(url).origin;
    const local = `${client.id} ${server} ${origin}`;
    if (this.nonces.get(local)?.nonce === nonce) return;
    this.nonces.set(local, { nonce, readAt: this.now() });
    // The fleet learns it on its own first try otherwise: never worth failing a call for.
    await this.store.learnNonce(client.id, server, origin, nonce).catch(() => undefined);
  }

  async thumbprint(client: ClientConfig): Promise<string> {
    return (await this.keyOf(client)).thumbprint;
  }

  /**
   * Loads the keys given by secret or file, so a bad one is named at start; the first failure
   * is thrown, and each is tried again on use. A generated key waits for its first use: the
   * store may not be connected yet.
   */
  async preload(clients: readonly ClientConfig[]): Promise<void> {
    const given = clients.filter((c) => c.dpop !== undefined && c.dpop.key.generate !== true);
    await Promise.all(given.map((c) => this.keyOf(c)));
  }

  private async nonce(client: ClientConfig, server: NonceServer, origin: string) {
    const local = `${client.id} ${server} ${origin}`;
    const held = this.nonces.get(local);
    if (held !== undefined && this.now() - held.readAt < LOCAL_NONCE_MS) return held.nonce;
    const nonce = await this.store.nonce(client.id, server, origin).catch(() => undefined);
    this.nonces.set(local, { nonce: nonce ?? held?.nonce, readAt: this.now() });
    return nonce ?? held?.nonce;
  }

  /** Memoised; a failure is not, so a fixed secret is picked up on the next use. */
  private keyOf(client: ClientConfig): Promise<DpopKey> {
    let key = this.keys.get(client.id);
    if (key === undefined) {
      key = this.loadKey(client);
      this.keys.set(client.id, key);
      key.catch(() => this.keys.delete(client.id));
    }
    return key;
  }

  private async loadKey(client: ClientConfig): Promise<DpopKey> {
    const settings = client.dpop;
    if (settings === undefined) {
      throw new DpopKeyError(`client "${client.id}" has no dpop settings`, { permanent: true });
    }
    const { key: source, alg } = settings;
    const where =
      source.secretId !== undefined
        ? `client "${client.id}": dpop.key.secretId (Secrets Manager secret "${shownReference(source.secretId)}")`
        : source.file !== undefined
          ? `client "${client.id}": dpop.key.file ("${shownReference(source.file)}")`
          : `client "${client.id}": the generated key of dpop.key.generate`;
    let text: string;
    try {
      text =
        source.secretId !== undefined
          ? await this.secrets.read({ secretId: source.secretId })
          : source.file !== undefined
            ? await this.secrets.read({ file: source.file })
            : await this.store.claimKey(client.id, () => generateDpopJwk(alg));
    } catch (cause) {
      // A secret that is missing or malformed stays so; one AWS or Redis could not serve may not.
      const permanent =
        cause instanceof DpopKeyError
          ? cause.permanent
          : (cause as { transient?: unknown }).transient === false;
      throw new DpopKeyError(
        `${where} cannot be read: ${cause instanceof Error ? cause.message : 'error'}`,
        { permanent, cause },
      );
    }
    try {
      return dpopKeyOf(text, alg, where);
    } catch (cause) {
      throw new DpopKeyError((cause as Error).message, { permanent: true });
    }
  }
}
