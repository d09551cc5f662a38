import {
  GetSecretValueCommand,
  SecretsManagerClient,
  SecretsManagerServiceException,
} from '@aws-sdk/client-secrets-manager';
import { SecretsManagerEmulator, secretsManagerClientEnv } from './secrets-manager-emulator';

const SECRET_ID = 'token-broker/acme-preprod';
const SECRET_VALUE = JSON.stringify({ client_id: 'acme', client_secret: 's3cret' });

describe(SecretsManagerEmulator.name, () => {
  let emu: SecretsManagerEmulator;
  let client: SecretsManagerClient;

  beforeEach(async () => {
    emu = await SecretsManagerEmulator.start({ secrets: { [SECRET_ID]: SECRET_VALUE } });
    client = new SecretsManagerClient({
      endpoint: emu.url,
      region: 'us-east-1',
      // Dummies: the emulator does not verify signatures.
      credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
      maxAttempts: 1,
    });
  });

  afterEach(async () => {
    client.destroy();
    await emu.close();
  });

  async function getError(secretId: string): Promise<SecretsManagerServiceException> {
    try {
      await client.send(new GetSecretValueCommand({ SecretId: secretId }));
    } catch (err) {
      return err as SecretsManagerServiceException;
    }
    throw new Error('expected GetSecretValue to fail');
  }

  function rawRequest(headers: Record<string, string>, body = `{"SecretId":"${SECRET_ID}"}`) {
    return fetch(`${emu.url}/`, {
      method: 'POST',
      headers: {
        'content-type': 'application/x-amz-json-1.1',
        'x-amz-target': 'secretsmanager.GetSecretValue',
        authorization:
          'AWS4-HMAC-SHA256 Credential=test/20250101/us-east-1/secretsmanager/aws4_request',
        ...headers,
      },
      body,
    });
  }

  it('serves GetSecretValue to the real SDK', async () => {
    const before = Math.floor(Date.now() / 1000);
    const out = await client.send(new GetSecretValueCommand({ SecretId: SECRET_ID }));
    expect(out).toMatchObject({
      ARN: `arn:aws:secretsmanager:us-east-1:000000000000:secret:${SECRET_ID}`,
      Name: SECRET_ID,
      SecretString: SECRET_VALUE,
      VersionStages: ['AWSCURRENT'],
    });
    expect(out.VersionId).toMatch(/^[0-9a-f-]{36}$/);
    expect(out.CreatedDate).toBeInstanceOf(Date);
    expect(out.CreatedDate!.getTime() / 1000).toBeGreaterThanOrEqual(before - 1);
    expect(out.$metadata.httpStatusCode).toBe(200);
    expect(emu.stats).toEqual({ requests: 1, bySecret: { [SECRET_ID]: 1 } });
  });

  it('finds a secret by the ARN it reports', async () => {
    const { ARN } = await client.send(new GetSecretValueCommand({ SecretId: SECRET_ID }));
    const byArn = await client.send(new GetSecretValueCommand({ SecretId: ARN }));
    expect(byArn.SecretString).toBe(SECRET_VALUE);
    expect(emu.stats.bySecret).toEqual({ [SECRET_ID]: 1, [ARN!]: 1 });
  });

  it('surfaces an unknown secret as ResourceNotFoundException', async () => {
    const err = await getError('nope');
    expect(err).toBeInstanceOf(SecretsManagerServiceException);
    expect(err.name).toBe('ResourceNotFoundException');
    expect(err.message).toBe("Secrets Manager can't find the specified secret.");
    expect(err.$metadata.httpStatusCode).toBe(400);
    expect(emu.stats).toEqual({ requests: 1, bySecret: { nope: 1 } });
  });

  it('serves a new version after setSecret and nothing after deleteSecret', async () => {
    const first = await client.send(new GetSecretValueCommand({ SecretId: SECRET_ID }));
    emu.setSecret(SECRET_ID, 'rotated');
    const second = await client.send(new GetSecretValueCommand({ SecretId: SECRET_ID }));
    expect(second.SecretString).toBe('rotated');
    expect(second.VersionId).not.toBe(first.VersionId);
    emu.deleteSecret(SECRET_ID);
    expect((await getError(SECRET_ID)).name).toBe('ResourceNotFoundException');
    expect(emu.stats.bySecret[SECRET_ID]).toBe(3);
  });

  it('serves the staging labels a rotation sets, and ResourceNotFoundException for others', async () => {
    emu.setSecretStage(SECRET_ID, 'AWSPENDING', 'pending');
    const read = (VersionStage?: string) =>
      client.send(new GetSecretValueCommand({ SecretId: SECRET_ID, VersionStage }));
    await expect(read('AWSPENDING')).resolves.toMatchObject({
      SecretString: 'pending',
      VersionStages: ['AWSPENDING'],
    });
    await expect(read('AWSCURRENT')).resolves.toMatchObject({ SecretString: SECRET_VALUE });
    await expect(read('AWSPREVIOUS')).rejects.toMatchObject({
      name: 'ResourceNotFoundException',
      message:
        "Secrets Manager can't find the specified secret value for staging label: AWSPREVIOUS",
    });
    emu.setSecretStage(SECRET_ID, 'AWSPENDING', undefined);
    await expect(read('AWSPENDING')).rejects.toMatchObject({ name: 'ResourceNotFoundException' });
  });

  it.each([
    [500, 'InternalServiceError'],
    [400, 'ThrottlingException'],
  ])('fails the next n requests with failNext (%i %s), then recovers', async (status, type) => {
    emu.failNext(2, { status, type });
    for (let i = 0; i < 2; i++) {
      const err = await getError(SECRET_ID);
      expect(err.name).toBe(type);
      expect(err.$metadata.httpStatusCode).toBe(status);
    }
    const ok = await client.send(new GetSecretValueCommand({ SecretId: SECRET_ID }));
    expect(ok.SecretString).toBe(SECRET_VALUE);
    expect(emu.stats.requests).toBe(3);
  });

  it('answers a valid raw request in the AWS JSON 1.1 shape', async () => {
    const res = await rawRequest({});
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/x-amz-json-1.1');
    expect(await res.json()).toMatchObject({ Name: SECRET_ID, SecretString: SECRET_VALUE });
  });

  it('requires an Authorization header, without checking its signature', async () => {
    const res = await rawRequest({ authorization: '' });
    expect(res.status).toBe(403);
    expect(await res.json()).toMatchObject({ __type: 'UnrecognizedClientException' });
  });

  it.each([
    [
      'another operation',
      { 'x-amz-target': 'secretsmanager.PutSecretValue' },
      undefined,
      400,
      'InvalidRequestException',
    ],
    ['no operation', { 'x-amz-target': '' }, undefined, 400, 'InvalidRequestException'],
    ['a malformed body', {}, '{"SecretId":', 400, 'SerializationException'],
    ['no SecretId', {}, '{}', 400, 'InvalidParameterException'],
  ])('answers %s with %i %s', async (_what, headers, body, status, type) => {
    const res = await rawRequest(headers, body);
    expect(res.status).toBe(status);
    expect(await res.json()).toEqual({ __type: type, message: expect.any(String) });
  });

  it('answers other paths and methods with 404', async () => {
    expect((await fetch(`${emu.url}/`)).status).toBe(404);
    expect((await fetch(`${emu.url}/other`, { method: 'POST' })).status).toBe(404);
  });

  it('gives a default-configured SDK client everything it needs through secretsManagerClientEnv', async () => {
    const env = secretsManagerClientEnv(emu.url);
    expect(env).toEqual({
      AWS_ENDPOINT_URL_SECRETS_MANAGER: emu.url,
      AWS_REGION: 'us-east-1',
      AWS_ACCESS_KEY_ID: 'test',
      AWS_SECRET_ACCESS_KEY: 'test',
    });
    const saved = { ...process.env };
    // Nothing else in the environment may redirect the client (a developer's profile, say).
    for (const key of Object.keys(process.env)) if (key.startsWith('AWS_')) delete process.env[key];
    Object.assign(process.env, env);
    const envClient = new SecretsManagerClient({ maxAttempts: 1 });
    try {
      const out = await envClient.send(new GetSecretValueCommand({ SecretId: SECRET_ID }));
      expect(out.SecretString).toBe(SECRET_VALUE);
    } finally {
      envClient.destroy();
      process.env = saved;
    }
  });
});
