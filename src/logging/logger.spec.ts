import { auditLogger, createLogger } from './logger';

/** A logger writing into an array of parsed lines. */
function capture(): { lines: Record<string, unknown>[]; logger: ReturnType<typeof createLogger> } {
  const lines: Record<string, unknown>[] = [];
  const logger = createLogger('info', {
    write(chunk: string) {
      for (const line of chunk.split('\n')) if (line !== '') lines.push(JSON.parse(line));
    },
  });
  return { lines, logger };
}

describe('createLogger', () => {
  it('redacts secrets at the top level and one level down', () => {
    const { lines, logger } = capture();
    logger.info(
      {
        access_token: 'tok-1',
        client_secret: 'sec-1',
        req: { headers: { authorization: 'Bearer tok-2', accept: 'application/json' } },
        grant: { access_token: 'tok-3', expires_in: 60 },
      },
      'line',
    );
    expect(lines[0]).toMatchObject({
      access_token: '[redacted]',
      client_secret: '[redacted]',
      req: { headers: { authorization: '[redacted]', accept: 'application/json' } },
      grant: { access_token: '[redacted]', expires_in: 60 },
    });
    expect(JSON.stringify(lines)).not.toMatch(/tok-|sec-/);
  });
});

describe(auditLogger.name, () => {
  it('names its trail and redacts every secret field of a flat record', () => {
    const { lines, logger } = capture();
    auditLogger(logger, 'orders').info(
      {
        caller: 'checkout',
        fp: '0123456789abcdef',
        token: 'tok-1',
        authorization: 'Bearer tok-2',
        apiKey: 'key-1',
        key: 'key-2',
        secret: 'sec-1',
        client_secret: 'sec-2',
      },
      'order',
    );
    expect(lines[0]).toMatchObject({
      audit: 'orders',
      caller: 'checkout',
      fp: '0123456789abcdef',
      token: '[redacted]',
      authorization: '[redacted]',
      apiKey: '[redacted]',
      key: '[redacted]',
      secret: '[redacted]',
      client_secret: '[redacted]',
      msg: 'order',
    });
    expect(JSON.stringify(lines)).not.toMatch(/tok-|key-|sec-/);
  });
});
