import { readFile } from 'node:fs/promises';
import {
  GetSecretValueCommand,
  SecretsManagerClient,
  SecretsManagerServiceException,
} from '@aws-sdk/client-secrets-manager';
import { SecretsErrorCode, SecretsException } from './secrets.exception';

/** Where a secret lives: exactly one of a Secrets Manager id (name or ARN) or a file path. */
export type SecretRef =
  | { secretId: string; file?: undefined }
  | { file: string; secretId?: undefined };

/**
 * Reads secret strings. The only place that speaks the AWS SDK or touches secret files; every
 * failure leaves here as a {@link SecretsException}.
 */
export interface SecretReader {
  read(ref: SecretRef): Promise<string>;
}

/** AWS error names that mean "nobody changed anything, try again later". */
const TRANSIENT_AWS_ERRORS = new Set([
  'InternalServiceError',
  'ThrottlingException',
  'ServiceUnavailable',
  'RequestTimeout',
  'TimeoutError',
]);

/**
 * Secrets Manager via the official SDK (region, endpoint and credentials from its standard
 * environment, e.g. IRSA on EKS), or a local file.
 */
export class AwsSecretReader implements SecretReader {
  private client?: SecretsManagerClient;

  constructor(private readonly timeoutMs = 5000) {}

  async read(ref: SecretRef): Promise<string> {
    return ref.file !== undefined ? this.readFromFile(ref.file) : this.readFromAws(ref.secretId);
  }

  destroy(): void {
    this.client?.destroy();
  }

  private async readFromAws(secretId: string): Promise<string> {
    // Created lazily: a file-only deployment must not need AWS_REGION.
    this.client ??= new SecretsManagerClient({ maxAttempts: 2 });
    let value: string | undefined;
    try {
      const out = await this.client.send(new GetSecretValueCommand({ SecretId: secretId }), {
        abortSignal: AbortSignal.timeout(this.timeoutMs),
      });
      value = out.SecretString;
    } catch (cause) {
      throw translateAwsError(secretId, cause);
    }
    if (value === undefined || value === '') {
      throw new SecretsException(
        SecretsErrorCode.Malformed,
        secretId,
        `Secrets Manager secret "${secretId}" has no SecretString; store the JSON as a string secret`,
      );
    }
    return value;
  }

  private async readFromFile(file: string): Promise<string> {
    try {
      return await readFile(file, 'utf8');
    } catch (cause) {
      const code = (cause as NodeJS.ErrnoException).code;
      const errorCode =
        code === 'ENOENT'
          ? SecretsErrorCode.NotFound
          : code === 'EACCES' || code === 'EPERM'
            ? SecretsErrorCode.AccessDenied
            : SecretsErrorCode.Unavailable;
      throw new SecretsException(
        errorCode,
        file,
        `cannot read secret file "${file}" (${code ?? 'error'}); check the path and the mount`,
        { cause },
      );
    }
  }
}

function translateAwsError(secretId: string, cause: unknown): SecretsException {
  const name = cause instanceof Error ? cause.name : 'Error';
  if (name === 'ResourceNotFoundException') {
    return new SecretsException(
      SecretsErrorCode.NotFound,
      secretId,
      `Secrets Manager secret "${secretId}" not found; check the name/ARN and AWS_REGION`,
      { cause },
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
      secretId,
      `not allowed to read Secrets Manager secret "${secretId}" (${name}); check the IAM role (IRSA) and the KMS key policy`,
      { cause },
    );
  }
  const transient =
    TRANSIENT_AWS_ERRORS.has(name) ||
    !(cause instanceof SecretsManagerServiceException) ||
    (cause.$metadata.httpStatusCode ?? 500) >= 500;
  return new SecretsException(
    transient ? SecretsErrorCode.Unavailable : SecretsErrorCode.AccessDenied,
    secretId,
    `reading Secrets Manager secret "${secretId}" failed (${name}); ${transient ? 'will retry' : 'check the secret and the IAM policy'}`,
    { cause },
  );
}
