import { createServer } from 'node:http';
import { Pool } from 'undici';

/**
 * The floor for `POST /orders`: the least a Node forwarder can do. A bare `node:http` server
 * that reads the body and sends it to the provider emulator with the provider's headers over
 * a keep-alive undici pool (`dispatch`, as the broker does), then relays status, content type
 * and body. No authentication, validation, idempotency, audit, metrics or error mapping.
 *
 * Measured beside the broker and the direct call in the same rounds, it shows how much of the
 * gap to the direct call any forwarding process costs on this machine, and how much is the
 * broker's own work. Argv: port, target URL, provider token. A GET is forwarded as a GET to the
 * target (path and query): the floor for the provider passthrough's forwarded GET.
 */
const [port, target, token] = process.argv.slice(2);
const url = new URL(target);
const pool = new Pool(url.origin, { connections: 128 });
const headers = {
  'content-type': 'application/json',
  accept: 'application/json',
  authorization: `Bearer ${token}`,
};

createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const parts: Buffer[] = [];
    let status = 502;
    let contentType: string | undefined;
    // A GET (the passthrough's benchmark) goes on as a GET with the target's query, no body.
    const get = req.method === 'GET';
    pool.dispatch(
      get
        ? { path: `${url.pathname}${url.search}`, method: 'GET', headers }
        : { path: url.pathname, method: 'POST', headers, body: Buffer.concat(chunks) },
      {
        onRequestStart: () => undefined,
        onResponseStart: (_c, statusCode, h) => {
          status = statusCode;
          contentType = h['content-type'] as string | undefined;
        },
        onResponseData: (_c, chunk) => {
          parts.push(chunk);
        },
        onResponseEnd: () => {
          const body = Buffer.concat(parts);
          res.writeHead(status, {
            'content-type': contentType ?? 'application/octet-stream',
            'content-length': body.length,
          });
          res.end(body);
        },
        onResponseError: () => {
          res.writeHead(502);
          res.end();
        },
      },
    );
  });
}).listen(Number(port), '127.0.0.1', () => process.send?.('ready'));
