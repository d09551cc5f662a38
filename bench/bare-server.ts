import { createServer } from 'node:http';

/**
 * The baseline for `GET /token`: a bare `node:http` server answering a constant body of the
 * same size and headers as the broker's token response. Run as its own process so it gets
 * the same CPU share as the broker.
 */
const port = Number(process.argv[2]);
const size = Number(process.argv[3]);
const prefix = '{"access_token":"';
const suffix = '","token_type":"Bearer","expires_in":1799,"expires_at":"2026-11-22T01:00:00.000Z"}';
const body = Buffer.from(
  prefix + 'x'.repeat(Math.max(1, size - prefix.length - suffix.length)) + suffix,
);

createServer((_req, res) => {
  res.writeHead(200, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': body.length,
    'cache-control': 'no-store',
  });
  res.end(body);
}).listen(port, '127.0.0.1', () => process.send?.('ready'));
