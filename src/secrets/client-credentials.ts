import { z } from 'zod';
import type { CredentialsSource } from '../config/config.schema';
import type { SecretReader } from './secret-reader';
import { SecretsErrorCode, SecretsException } from './secrets.exception';

/** One merchant-environment's provider credentials. Never log this object. */
export interface ClientCredentials {
  readonly clientId: string;
  readonly clientSecret: string;
}

const credentialsJson = z.object({
  client_id: z.string().min(1),
  client_secret: z.string().min(1),
});

/** Reads and validates `{"client_id","client_secret"}` from the configured source. */
export async function loadClientCredentials(
  reader: SecretReader,
  source: CredentialsSource,
): Promise<ClientCredentials> {
  const ref = source.file !== undefined ? { file: source.file } : { secretId: source.secretId! };
  const where = ref.file ?? ref.secretId;
  const text = await reader.read(ref);
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    // No cause: the parser's message quotes the text, which is the secret.
    throw new SecretsException(
      SecretsErrorCode.Malformed,
      `credentials in "${where}" are not JSON; expected {"client_id": "...", "client_secret": "..."}`,
      { source: where },
    );
  }
  const parsed = credentialsJson.safeParse(json);
  if (!parsed.success) {
    const fields = [...new Set(parsed.error.issues.map((i) => i.path.join('.') || '(root)'))];
    throw new SecretsException(
      SecretsErrorCode.Malformed,
      `credentials in "${where}" lack a non-empty ${fields.join(', ')}; expected {"client_id": "...", "client_secret": "..."}`,
      { source: where },
    );
  }
  return { clientId: parsed.data.client_id, clientSecret: parsed.data.client_secret };
}
