import { createServer } from 'node:http';

/**
 * The baseline for `GET /token`: a bare `node:http` server answering a constant response of the
 * same size as the broker's: same body length and the same headers with values of the same
 * length, so the load generator parses identical bytes from both. Run as its own process so
 * it gets the same CPU share as the broker.
 */
const port = Number(process.argv[2]);
const size = Number(process.argv[3]);
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
  res.writeHead(200, headers);
  res.end(body);
}).listen(port, '127.0.0.1', () => process.send?.('ready'));
