import { z } from 'zod';
import type { ClientAuthMethod, ClientCredentialsSource } from '../config/client.schema';
import { parseSecretJson, readSource, type SecretReader } from './secret-reader';
import { SecretsException } from './secrets.exception';

/** Never log this object. */
export interface ClientCredentials {
  readonly clientId: string;
  /** `client_secret_basic`, `client_secret_post` and the provider's dialect. */
  readonly clientSecret?: string;
  /** `private_key_jwt` (PEM or a JWK as JSON) and the mutual-TLS methods (PEM). */
  readonly privateKey?: string;
  /** The mutual-TLS methods: the client certificate (chain), PEM. */
  readonly certificate?: string;
}

const credentialsJson = z.object({
  client_id: z.string().min(1),
  client_secret: z.string().min(1).optional(),
  // A JWK may arrive as an object rather than as JSON text.
  private_key: z
    .union([z.string().min(1), z.record(z.string(), z.unknown())])
    .transform((v) => (typeof v === 'string' ? v : JSON.stringify(v)))
    .optional(),
  certificate: z.string().min(1).optional(),
});

const SHARED_SECRET = {
  fields: ['client_secret'],
  example: '{"client_id": "...", "client_secret": "..."}',
};

const MUTUAL_TLS = {
  fields: ['certificate', 'private_key'],
  example:
    '{"client_id": "...", "certificate": "-----BEGIN CERTIFICATE-----...", "private_key": "-----BEGIN PRIVATE KEY-----..."}',
};

/** What each method needs; a secret beside a key is refused. */
const NEEDS: Record<ClientAuthMethod, { fields: readonly string[]; example: string }> = {
  client_secret_basic: SHARED_SECRET,
  client_secret_post: SHARED_SECRET,
  private_key_jwt: {
    fields: ['private_key'],
    example: '{"client_id": "...", "private_key": "-----BEGIN PRIVATE KEY-----..." or a JWK}',
  },
  tls_client_auth: MUTUAL_TLS,
  self_signed_tls_client_auth: MUTUAL_TLS,
};

/**
 * Refuses a secret where a key is needed (or the reverse), naming fields, never values.
 * `versionStage`: a Secrets Manager staging label (rotation). Key files are read on every call,
 * so a rotated Kubernetes Secret is picked up like a re-read JSON file.
 */
export async function loadClientCredentials(
  reader: SecretReader,
  source: ClientCredentialsSource,
  auth: ClientAuthMethod = 'client_secret_basic',
  versionStage?: string,
): Promise<ClientCredentials> {
  if (source.privateKeyFile !== undefined) {
    const [privateKey, certificate] = await Promise.all([
      reader.read({ file: source.privateKeyFile }),
      source.certificateFile !== undefined
        ? reader.read({ file: source.certificateFile })
        : undefined,
    ]);
    return {
      clientId: source.clientId!,
      privateKey,
      ...(certificate !== undefined && { certificate }),
    };
  }
  const { text, where } = await readSource(reader, source, versionStage);
  return parseClientCredentials(text, where, auth);
}

export function parseClientCredentials(
  text: string,
  where: string,
  auth: ClientAuthMethod,
): ClientCredentials {
  const { fields, example } = NEEDS[auth];
  const json = parseSecretJson(
    text,
    where,
    `credentials in "${where}" are not JSON; expected ${example}`,
  );
  const parsed = credentialsJson.safeParse(json);
  if (!parsed.success) {
    const bad = [...new Set(parsed.error.issues.map((i) => i.path.join('.') || '(root)'))];
    throw SecretsException.malformed(
      where,
      `credentials in "${where}" lack a valid ${bad.join(', ')}; expected ${example}`,
    );
  }
  const c = parsed.data;
  const missing = fields.filter((f) => c[f as keyof typeof c] === undefined);
  if (missing.length > 0) {
    throw SecretsException.malformed(
      where,
      `credentials in "${where}" lack ${missing.join(', ')}, which auth "${auth}" needs; expected ${example}`,
    );
  }
  // A secret beside a key would be sent nowhere: refuse it rather than keep it in memory.
  if (fields.includes('private_key') && c.client_secret !== undefined) {
    throw SecretsException.malformed(
      where,
      `credentials in "${where}" hold a client_secret, but auth "${auth}" uses a key and no shared secret; remove client_secret, expected ${example}`,
    );
  }
  return {
    clientId: c.client_id,
    ...(c.client_secret !== undefined && { clientSecret: c.client_secret }),
    ...(c.private_key !== undefined && { privateKey: c.private_key }),
    ...(c.certificate !== undefined && { certificate: c.certificate }),
  };
}

/** Every field of {@link ClientCredentials}: the compiler refuses the record if one is missing. */
const CREDENTIAL_FIELDS = Object.keys({
  clientId: true,
  clientSecret: true,
  privateKey: true,
  certificate: true,
} satisfies Record<keyof ClientCredentials, true>) as (keyof ClientCredentials)[];

export function sameCredentials(a: ClientCredentials, b: ClientCredentials): boolean {
  return CREDENTIAL_FIELDS.every((field) => a[field] === b[field]);
}
