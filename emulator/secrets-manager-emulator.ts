import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { EmulatorHttpServer, parseTarget, readBody, sendJson } from './emulator-http-server';

/** Region and account the emulator claims in ARNs; matches {@link secretsManagerClientEnv}. */
const REGION = 'us-east-1';
const ACCOUNT = '000000000000';
const ARN_PREFIX = `arn:aws:secretsmanager:${REGION}:${ACCOUNT}:secret:`;
/** The AWS JSON 1.1 protocol the SDK speaks to Secrets Manager. */
const AMZ_JSON = 'application/x-amz-json-1.1';
/** GetSecretValue requests are tiny; anything near this is not one. */
const MAX_BODY_BYTES = 64 * 1024;

/** How to start a {@link SecretsManagerEmulator}. */
export interface SecretsManagerEmulatorOptions {
  /** TCP port; `0` or absent picks a free one. */
  port?: number;
  /** Interface to bind. @default '127.0.0.1' */
  host?: string;
  /** Secret name -> `SecretString`. */
  secrets: Record<string, string>;
}

/** An AWS error to answer with instead of the real outcome. */
export interface SecretsManagerFailure {
  /** HTTP status, e.g. 500 for `InternalServiceError`, 400 for `ThrottlingException`. */
  status: number;
  /** The AWS error code (`__type`), which the SDK turns into the error's `name`. */
  type: string;
  /** @default a generic message naming the type */
  message?: string;
}

/** What the emulator has seen since start. */
export interface SecretsManagerStats {
  /** Every request, whatever its outcome. */
  requests: number;
  /** GetSecretValue requests per `SecretId` as sent (a name or an ARN). */
  bySecret: Record<string, number>;
}

interface StoredSecret {
  value: string;
  versionId: string;
  /** Epoch seconds, which is how the AWS JSON protocol sends timestamps. */
  createdDate: number;
}

/**
 * AWS Secrets Manager's `GetSecretValue`, enough for the real `@aws-sdk/client-secrets-manager`
 * pointed at it through `endpoint` or `AWS_ENDPOINT_URL_SECRETS_MANAGER`. SigV4 signatures are
 * not verified (the credentials are dummies), but a request must be signed at all, which
 * catches a client that lost its credential chain.
 */
export class SecretsManagerEmulator {
  private readonly secrets = new Map<string, StoredSecret>();
  /** Versions under other staging labels (`AWSPENDING`, `AWSPREVIOUS`), per secret name. */
  private readonly staged = new Map<string, Map<string, StoredSecret>>();
  private readonly failures: SecretsManagerFailure[] = [];
  private current: SecretsManagerStats = { requests: 0, bySecret: {} };
  private http!: EmulatorHttpServer;

  private constructor(secrets: Record<string, string>) {
    for (const [id, value] of Object.entries(secrets)) this.setSecret(id, value);
  }

  /** Starts an emulator listening on `opts.port` (random when absent). */
  static async start(opts: SecretsManagerEmulatorOptions): Promise<SecretsManagerEmulator> {
    const emulator = new SecretsManagerEmulator(opts.secrets);
    emulator.http = await EmulatorHttpServer.listen(opts, (req, res) => emulator.handle(req, res));
    return emulator;
  }

  /** The endpoint to give the SDK, e.g. `http://127.0.0.1:40123`. */
  get url(): string {
    return this.http.url;
  }

  /** Creates or replaces a secret; a replacement gets a new version, as rotation would. */
  setSecret(id: string, value: string): void {
    this.secrets.set(id, {
      value,
      versionId: randomUUID(),
      createdDate: Math.floor(Date.now() / 1000),
    });
  }

  /**
   * Sets (or with `undefined` removes) the version a staging label other than `AWSCURRENT`
   * points at, as a rotation does: `AWSPENDING` while the new secret is tested, `AWSPREVIOUS`
   * once it was promoted. A read asking for a label that points nowhere gets
   * `ResourceNotFoundException`, as on AWS.
   */
  setSecretStage(id: string, stage: string, value: string | undefined): void {
    const stages = this.staged.get(id) ?? new Map<string, StoredSecret>();
    if (value === undefined) stages.delete(stage);
    else
      stages.set(stage, {
        value,
        versionId: randomUUID(),
        createdDate: Math.floor(Date.now() / 1000),
      });
    this.staged.set(id, stages);
  }

  /** Removes a secret: reads of it get `ResourceNotFoundException`. */
  deleteSecret(id: string): void {
    this.secrets.delete(id);
  }

  /** The next `n` requests fail with this AWS error, whatever they ask for. */
  failNext(n: number, failure: SecretsManagerFailure): void {
    for (let i = 0; i < n; i++) this.failures.push(failure);
  }

  /** A copy of what the emulator has seen. */
  get stats(): SecretsManagerStats {
    return structuredClone(this.current);
  }

  /** Stops listening and destroys every connection. */
  async close(): Promise<void> {
    await this.http.close();
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.current.requests++;
    const body = await readBody(req, MAX_BODY_BYTES);
    if (!body) return;
    const target = parseTarget(req);
    if (!target || target.pathname !== '/' || req.method !== 'POST') {
      awsError(res, 404, 'UnknownOperationException', 'Secrets Manager is served at POST /.');
      return;
    }
    if (body.tooLarge) {
      awsError(res, 413, 'SerializationException', 'Request body too large.');
      return;
    }
    let secretId: unknown;
    let versionStage: unknown;
    try {
      ({ SecretId: secretId, VersionStage: versionStage } = JSON.parse(
        body.bytes.toString('utf8'),
      ) as { SecretId?: unknown; VersionStage?: unknown });
    } catch {
      awsError(res, 400, 'SerializationException', 'The request body is not valid JSON.');
      return;
    }
    // Counted before injected failures so a test can see which secret a failed read was for.
    if (typeof secretId === 'string') {
      this.current.bySecret[secretId] = (this.current.bySecret[secretId] ?? 0) + 1;
    }

    const failure = this.failures.shift();
    if (failure) {
      awsError(res, failure.status, failure.type, failure.message ?? `Injected ${failure.type}.`);
      return;
    }
    if (!req.headers.authorization) {
      awsError(
        res,
        403,
        'UnrecognizedClientException',
        'The security token included in the request is invalid.',
      );
      return;
    }
    const operation = req.headers['x-amz-target'];
    if (operation !== 'secretsmanager.GetSecretValue') {
      awsError(
        res,
        400,
        'InvalidRequestException',
        `Only secretsmanager.GetSecretValue is emulated, not ${String(operation)}.`,
      );
      return;
    }
    if (typeof secretId !== 'string' || secretId === '') {
      awsError(res, 400, 'InvalidParameterException', 'SecretId is required.');
      return;
    }

    const name = secretId.startsWith(ARN_PREFIX) ? secretId.slice(ARN_PREFIX.length) : secretId;
    const stage =
      typeof versionStage === 'string' && versionStage !== '' ? versionStage : 'AWSCURRENT';
    const secret =
      stage === 'AWSCURRENT' ? this.secrets.get(name) : this.staged.get(name)?.get(stage);
    if (!secret && this.secrets.has(name)) {
      awsError(
        res,
        400,
        'ResourceNotFoundException',
        `Secrets Manager can't find the specified secret value for staging label: ${stage}`,
      );
      return;
    }
    if (!secret) {
      awsError(
        res,
        400,
        'ResourceNotFoundException',
        "Secrets Manager can't find the specified secret.",
      );
      return;
    }
    sendJson(
      res,
      200,
      {
        ARN: `${ARN_PREFIX}${name}`,
        Name: name,
        SecretString: secret.value,
        VersionId: secret.versionId,
        VersionStages: [stage],
        CreatedDate: secret.createdDate,
      },
      { 'x-amzn-requestid': randomUUID() },
      AMZ_JSON,
    );
  }
}

/** The AWS JSON 1.1 error shape: the SDK reads the code from `__type`. */
function awsError(res: ServerResponse, status: number, type: string, message: string): void {
  sendJson(res, status, { __type: type, message }, { 'x-amzn-requestid': randomUUID() }, AMZ_JSON);
}

/**
 * Environment for a child process whose default-configured `SecretsManagerClient` should use
 * the emulator at `url`. The keys are dummies: the emulator never checks signatures, and real
 * credentials must never reach a test process.
 */
export function secretsManagerClientEnv(url: string): {
  AWS_ENDPOINT_URL_SECRETS_MANAGER: string;
  AWS_REGION: string;
  AWS_ACCESS_KEY_ID: string;
  AWS_SECRET_ACCESS_KEY: string;
} {
  return {
    AWS_ENDPOINT_URL_SECRETS_MANAGER: url,
    AWS_REGION: REGION,
    // Dummy credentials: SigV4 needs some to sign with; nothing verifies them.
    AWS_ACCESS_KEY_ID: 'test',
    AWS_SECRET_ACCESS_KEY: 'test',
  };
}
