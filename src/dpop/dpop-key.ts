import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type JsonWebKey,
  type KeyObject,
} from 'node:crypto';
import type { DpopAlg } from '../config/client.schema';

/** A client's proof key: the private half signs, the public JWK goes in every proof's header. */
export interface DpopKey {
  readonly alg: DpopAlg;
  readonly privateKey: KeyObject;
  /** Public members only (RFC 9449 §4.2: `jwk` must not hold a private key). */
  readonly publicJwk: Readonly<JsonWebKey>;
  /** RFC 7638 SHA-256 thumbprint, base64url: the `cnf.jkt` the server binds tokens to. */
  readonly thumbprint: string;
}

/** The public members RFC 7638 hashes, per key type, in lexicographic order. */
const THUMBPRINT_MEMBERS: Record<string, readonly string[]> = {
  EC: ['crv', 'kty', 'x', 'y'],
  RSA: ['e', 'kty', 'n'],
  OKP: ['crv', 'kty', 'x'],
};

/** Why a key does not fit `alg`, or undefined when it does. */
function misfit(key: KeyObject, alg: DpopAlg): string | undefined {
  const type = key.asymmetricKeyType;
  switch (alg) {
    case 'ES256':
      return type === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1'
        ? undefined
        : 'ES256 needs an EC P-256 key';
    case 'PS256':
    case 'RS256':
      return type === 'rsa' && (key.asymmetricKeyDetails?.modulusLength ?? 0) >= 2048
        ? undefined
        : `${alg} needs an RSA key of 2048 bits or more`;
    case 'EdDSA':
      return type === 'ed25519' ? undefined : 'EdDSA needs an Ed25519 key';
  }
}

/**
 * A private key from a JWK or a PEM (PKCS#8, PKCS#1, SEC1). `where` names the setting in
 * messages; no message quotes the key, nor a parser's message (it may quote the key).
 */
export function dpopKeyOf(text: string, alg: DpopAlg, where: string): DpopKey {
  let privateKey: KeyObject;
  try {
    const trimmed = text.trim();
    privateKey = trimmed.startsWith('{')
      ? createPrivateKey({ key: JSON.parse(trimmed) as JsonWebKey, format: 'jwk' })
      : createPrivateKey(trimmed);
  } catch {
    throw new Error(`${where} holds neither a private JWK nor a PEM private key`);
  }
  const wrong = misfit(privateKey, alg);
  if (wrong !== undefined) {
    throw new Error(`${where}: ${wrong} (dpop.alg is "${alg}"); set dpop.alg to fit the key`);
  }
  const full = createPublicKey(privateKey).export({ format: 'jwk' });
  const members = THUMBPRINT_MEMBERS[full.kty!];
  const publicJwk = Object.fromEntries(members.map((m) => [m, full[m as keyof JsonWebKey]]));
  // RFC 7638 §3: the required members, lexicographic order, no whitespace.
  const thumbprint = createHash('sha256').update(JSON.stringify(publicJwk)).digest('base64url');
  return { alg, privateKey, publicJwk, thumbprint };
}

/** A new private key for `alg`, as the JWK the fleet stores. */
export function generateDpopJwk(alg: DpopAlg): string {
  const pair =
    alg === 'ES256'
      ? generateKeyPairSync('ec', { namedCurve: 'P-256' })
      : alg === 'EdDSA'
        ? generateKeyPairSync('ed25519')
        : generateKeyPairSync('rsa', { modulusLength: 2048 });
  return JSON.stringify(pair.privateKey.export({ format: 'jwk' }));
}
