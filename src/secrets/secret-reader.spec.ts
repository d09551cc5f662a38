import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { REFERENCE_NOT_SHOWN } from '../config/secret-reference';
import { AwsSecretReader, readSource } from './secret-reader';
import { SecretsErrorCode } from './secrets.exception';

/** The real AWS SDK against a loopback endpoint (its standard environment variables). */
describe(AwsSecretReader.name, () => {
  const saved = { ...process.env };
  let server: Server;
  let seen: number;

  beforeEach(async () => {
    seen = 0;
    // Answers 200, then a byte every 100 ms for 2 s: never idle long enough for an idle timer.
    server = createServer((req, res) => {
      seen++;
      req.resume();
      res.writeHead(200, { 'content-type': 'application/x-amz-json-1.1' });
      res.write('{"SecretString":"');
      let left = 20;
      const drip = setInterval(() => {
        if (--left > 0) res.write('x');
        else {
          clearInterval(drip);
          res.end('"}');
        }
      }, 100);
      req.socket.once('close', () => clearInterval(drip));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    Object.assign(process.env, {
      AWS_ENDPOINT_URL_SECRETS_MANAGER: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      AWS_REGION: 'us-east-1',
      AWS_ACCESS_KEY_ID: 'test',
      AWS_SECRET_ACCESS_KEY: 'test',
    });
  });
  afterEach(async () => {
    process.env = { ...saved };
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it('ends a read whose answer drips at its one deadline, without a retry', async () => {
    const reader = new AwsSecretReader(500);
    const started = performance.now();
    try {
      await expect(reader.read({ secretId: 'acme' })).rejects.toMatchObject({
        code: SecretsErrorCode.Unavailable,
      });
      expect(performance.now() - started).toBeLessThan(500 + 400);
      expect(seen).toBe(1);
    } finally {
      reader.onApplicationShutdown();
    }
  });
});

describe('secret references in messages', () => {
  it('names a missing file that looks like a path, and hides one that looks like a secret', async () => {
    const reader = new AwsSecretReader();
    await expect(reader.read({ file: '/no/such/credentials.json' })).rejects.toMatchObject({
      code: SecretsErrorCode.NotFound,
      message:
        'cannot read secret file "/no/such/credentials.json" (ENOENT); check the path and the mount',
    });
    const pasted = 'q7Zp3YV0kR8mWc2LxN5tB9hJ4dF6gS1aE0uI';
    const err = (await readSource(reader, { file: pasted }).catch((e: unknown) => e)) as Error & {
      source: string;
      cause: unknown;
    };
    expect(err.message).toBe(
      `cannot read secret file "${REFERENCE_NOT_SHOWN}" (ENOENT); check the path and the mount`,
    );
    expect(err.source).toBe(REFERENCE_NOT_SHOWN);
    // Node's own error quotes the path: not attached.
    expect(JSON.stringify({ cause: String(err.cause) })).not.toContain(pasted);
  });
});
