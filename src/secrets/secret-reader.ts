import { readFile } from 'node:fs/promises';
// Types only: the SDK itself is loaded on the first Secrets Manager read.
import type { SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { CredentialsSource } from '../config/client.schema';
import { shownReference } from '../config/secret-reference';
import { SecretsErrorCode, SecretsException } from './secrets.exception';

/** Exactly one of a Secrets Manager id (name or ARN) or a file path. */
export type SecretRef =
  | {
      secretId: string;
      /** `AWSPENDING`, `AWSPREVIOUS`. @default AWSCURRENT */
      versionStage?: string;
      file?: undefined;
    }
  | { file: string; secretId?: undefined; versionStage?: undefined };

/** Injection token for the {@link SecretReader} adapter. */
export const SECRET_READER = 'TOKEN_BROKER:SECRET_READER';

/** The only place that speaks the AWS SDK or reads secret files. */
export interface SecretReader {
  read(ref: SecretRef): Promise<string>;
}

/**
 * A configured source's text, and `where`: the file or secret id its messages name (as
 * {@link shownReference} prints it: a secret pasted in its place is not repeated).
 */
export async function readSource(
  reader: SecretReader,
  source: CredentialsSource,
  versionStage?: string,
): Promise<{ text: string; where: string }> {
  const ref: SecretRef =
    source.file !== undefined
      ? { file: source.file }
      : { secretId: source.secretId!, ...(versionStage !== undefined && { versionStage }) };
  return { text: await reader.read(ref), where: shownReference(ref.file ?? ref.secretId) };
}

/** Refused as malformed with `message`, with no cause: a parser message may quote the secret. */
export function parseSecretJson(text: string, where: string, message: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw SecretsException.malformed(where, message);
  }
}

type SecretsManagerSdk = typeof import('@aws-sdk/client-secrets-manager');

/** "Nobody changed anything, try again later". */
const TRANSIENT_AWS_ERRORS = new Set([
  'InternalServiceError',
  'ThrottlingException',
  'ServiceUnavailable',
  'RequestTimeout',
  'TimeoutError',
]);

/** Region, endpoint and credentials from the SDK's standard environment (e.g. IRSA). */
export class AwsSecretReader implements SecretReader {
  private sdk?: Promise<SecretsManagerSdk>;
  private client?: SecretsManagerClient;

  constructor(private readonly timeoutMs = 5000) {}

  async read(ref: SecretRef): Promise<string> {
    return ref.file !== undefined
      ? this.readFromFile(ref.file)
      : this.readFromAws(ref.secretId, ref.versionStage);
  }

  /** Nest calls it on the factory's instance at shutdown. */
  onApplicationShutdown(): void {
    this.client?.destroy();
  }

  // Messages and `source` name the secret as shownReference prints it; the SDK gets it as it is.
  private async readFromAws(secretId: string, versionStage?: string): Promise<string> {
    const shown = shownReference(secretId);
    const sdk = await this.loadSdk(shown);
    // Created lazily: a file-only deployment must not need AWS_REGION.
    this.client ??= new sdk.SecretsManagerClient({ maxAttempts: 2 });
    let value: string | undefined;
    try {
      const out = await this.client.send(
        new sdk.GetSecretValueCommand({
          SecretId: secretId,
          ...(versionStage !== undefined && { VersionStage: versionStage }),
        }),
        { abortSignal: AbortSignal.timeout(this.timeoutMs) },
      );
      value = out.SecretString;
    } catch (cause) {
      // The SDK's message may quote the id (an access-denied names the resource).
      throw translateAwsError(
        shown,
        shown === secretId ? cause : undefined,
        cause,
        sdk.SecretsManagerServiceException,
      );
    }
    if (value === undefined || value === '') {
      throw SecretsException.malformed(
        shown,
        `Secrets Manager secret "${shown}" has no SecretString; store the JSON as a string secret`,
      );
    }
    return value;
  }

  /**
   * Loaded on the first Secrets Manager read: the largest dependency, and a deployment whose
   * secrets are all files never needs it.
   */
  private async loadSdk(shownSecretId: string): Promise<SecretsManagerSdk> {
    this.sdk ??= import('@aws-sdk/client-secrets-manager');
    try {
      return await this.sdk;
    } catch (cause) {
      this.sdk = undefined;
      throw new SecretsException(
        SecretsErrorCode.Unavailable,
        `cannot load the AWS SDK (@aws-sdk/client-secrets-manager) to read "${shownSecretId}"; check that the image ships the production dependencies`,
        { source: shownSecretId, cause },
      );
    }
  }

  private async readFromFile(file: string): Promise<string> {
    try {
      return await readFile(file, 'utf8');
    } catch (cause) {
      const shown = shownReference(file);
      const code = (cause as NodeJS.ErrnoException).code;
      const errorCode =
        code === 'ENOENT'
          ? SecretsErrorCode.NotFound
          : code === 'EACCES' || code === 'EPERM'
            ? SecretsErrorCode.AccessDenied
            : SecretsErrorCode.Unavailable;
      throw new SecretsException(
        errorCode,
        `cannot read secret file "${shown}" (${code ?? 'error'}); check the path and the mount`,
        { source: shown, cause: shown === file ? cause : code },
      );
    }
  }
}

/**
 * `shownSecretId`: the id as {@link shownReference} prints it; `cause`: the SDK's error when it
 * may be kept (it may quote the id), `error` to classify.
 */
function translateAwsError(
  shownSecretId: string,
  cause: unknown,
  error: unknown,
  ServiceException: SecretsManagerSdk['SecretsManagerServiceException'],
): SecretsException {
  const name = error instanceof Error ? error.name : 'Error';
  if (name === 'ResourceNotFoundException') {
    return new SecretsException(
      SecretsErrorCode.NotFound,
      `Secrets Manager secret "${shownSecretId}" not found; check the name/ARN and AWS_REGION`,
      { source: shownSecretId, cause },
    );
  }
  if (
    name === 'AccessDeniedException' ||
    name === 'UnrecognizedClientException' ||
    name === 'DecryptionFailure' ||
    name === 'CredentialsProviderError'
  ) {
    return new SecretsException(
      SecretsErrorCode.AccessDenied,
      `not allowed to read Secrets Manager secret "${shownSecretId}" (${name}); check the IAM role (IRSA) and the KMS key policy`,
      { source: shownSecretId, cause },
    );
  }
  const transient =
    TRANSIENT_AWS_ERRORS.has(name) ||
    !(error instanceof ServiceException) ||
    (error.$metadata.httpStatusCode ?? 500) >= 500;
  return new SecretsException(
    transient ? SecretsErrorCode.Unavailable : SecretsErrorCode.AccessDenied,
    `reading Secrets Manager secret "${shownSecretId}" failed (${name}); ${transient ? 'will retry' : 'check the secret and the IAM policy'}`,
    { source: shownSecretId, cause },
  );
}
