import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { AuditLineWriter } from '../src/logging/audit-line.writer';
import { createLogger } from '../src/logging/logger';

/**
 * The baseline for `GET /token`: a bare `node:http` server answering a constant response of the
 * same size as the broker's: same body length and the same headers with values of the same
 * length, so the load generator parses identical bytes from both. Run as its own process so
 * it gets the same CPU share as the broker.
 *
 * With `audit` as third argument it also writes, per request, the audit line the broker writes
 * per token handed out, the way the broker writes it (its logger, `AuditLineWriter`, JSON on
 * stdout): what the audit trail alone costs a server that does nothing else.
 */
const port = Number(process.argv[2]);
const size = Number(process.argv[3]);
const audit =
  process.argv[4] === 'audit'
    ? new AuditLineWriter(createLogger('info').child({ audit: 'token' }), 'token issued')
    : null;
const fixedFields =
  AuditLineWriter.field('caller', 'bench') +
  AuditLineWriter.field('client', 'bench') +
  AuditLineWriter.field('fp', '0123456789abcdef') +
  AuditLineWriter.field('result', 'issued');
const prefix = '{"access_token":"';
const suffix = '","token_type":"Bearer","expires_in":1799,"expires_at":"2026-11-22T01:00:00.000Z"}';
const body = Buffer.from(
  prefix + 'x'.repeat(Math.max(1, size - prefix.length - suffix.length)) + suffix,
);
const headers = {
  'content-type': 'application/json; charset=utf-8',
  'content-length': body.length,
  'cache-control': 'no-store',
  pragma: 'no-cache',
  'x-request-id': '00000000-0000-4000-8000-000000000000',
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'content-security-policy': "default-src 'none'; frame-ancestors 'none'",
  'referrer-policy': 'no-referrer',
};

createServer((_req, res) => {
  audit?.write(AuditLineWriter.field('reqId', randomUUID()) + fixedFields);
  res.writeHead(200, headers);
  res.end(body);
}).listen(port, '127.0.0.1', () => process.send?.('ready'));
