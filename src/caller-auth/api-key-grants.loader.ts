import { type ApiKeyGrant, apiKeyGrantListSchema } from '../config/caller-auth.schema';
import type { CredentialsSource } from '../config/client.schema';
import { parseSecretJson, readSource, type SecretReader } from '../secrets/secret-reader';
import { SecretsException } from '../secrets/secrets.exception';

const EXPECTED =
  'expected a JSON list like [{"name": "checkout", "sha256": "<64 hex digits>", "clients": ["acme-prod"]}]';

/** A grant naming an unconfigured client is refused: it would only produce puzzling 403s. */
export async function loadApiKeyGrants(
  reader: SecretReader,
  source: CredentialsSource,
  knownClients: ReadonlySet<string>,
): Promise<ApiKeyGrant[]> {
  const { text, where } = await readSource(reader, source);
  const json = parseSecretJson(text, where, `API keys in "${where}" are not JSON; ${EXPECTED}`);
  const parsed = apiKeyGrantListSchema.safeParse(json);
  if (!parsed.success) {
    const at = [...new Set(parsed.error.issues.map((i) => `[${i.path.map(String).join('.')}]`))];
    throw SecretsException.malformed(
      where,
      `API keys in "${where}" are malformed at ${at.join(', ')} (hashes only, never keys); ${EXPECTED}`,
    );
  }
  parsed.data.forEach((g, i) => {
    if (g.clients.some((c) => c !== '*' && !knownClients.has(c))) {
      throw SecretsException.malformed(
        where,
        `API key ${i} ("${g.name}") in "${where}" grants a client that is not configured; fix the client id or configure the client`,
      );
    }
  });
  return parsed.data;
}
