import type { IncomingMessage, ServerResponse } from 'node:http';
import { Inject, Injectable } from '@nestjs/common';
import { CALLER_AUTHENTICATOR, type Caller, type CallerAuthenticator } from '../caller-auth/caller';
import { requestIdFrom } from '../http/request-id';
import { SECURITY_HEADERS } from '../http/security-headers';
import { HttpMetricsHook } from '../metrics/http-metrics.hook';
import { tokenBody } from './token-body';
import { parseMinTtl, TokenRoute } from './token.route';
import { TokenService } from './token.service';

/**
 * The cache hit of `GET /token`, answered straight from Node's request event, before Fastify.
 *
 * Measured here, Fastify's request pipeline (routing, hooks, reply, serialisation) cost about a
 * third of the broker's CPU per token served, which kept the hot path far from the bare
 * `node:http` baseline it is held to. This handles only the common, fully valid case (an
 * authenticated caller, a valid query, a token in L1): it answers with the same headers, body,
 * audit line and metrics as {@link TokenRoute}. Anything else — a miss, an error, an unusual
 * query, an authenticator that needs I/O — returns `false` and Fastify serves the request
 * through the full route, so every error keeps one implementation.
 */
@Injectable()
export class TokenFastPath {
  constructor(
    private readonly tokens: TokenService,
    @Inject(CALLER_AUTHENTICATOR) private readonly auth: CallerAuthenticator,
    private readonly route: TokenRoute,
    private readonly httpMetrics: HttpMetricsHook,
  ) {}

  /** Serves `req` if it is a plain `GET /token` cache hit; returns whether it did. */
  tryServe(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url;
    if (req.method !== 'GET' || url === undefined || !url.startsWith('/token')) return false;
    let client: string | undefined;
    let minTtl: string | undefined;
    if (url.length > 6) {
      if (url.charCodeAt(6) !== 63 /* ? */) return false;
      for (const pair of url.slice(7).split('&')) {
        const eq = pair.indexOf('=');
        const key = eq < 0 ? pair : pair.slice(0, eq);
        const value = eq < 0 ? '' : pair.slice(eq + 1);
        // Escapes, repeats and other parameters: leave the exact semantics to the full route.
        if (value.includes('%') || value.includes('+')) return false;
        if (key === 'client' && client === undefined) client = value;
        else if (key === 'min_ttl' && minTtl === undefined) minTtl = value;
        else return false;
      }
    }
    let caller: Caller;
    let clientId: string;
    let minMs: number;
    try {
      const authenticated = this.auth.authenticate(req.headers.authorization);
      if (authenticated instanceof Promise) {
        // Verification needs I/O: the full route awaits it (and caches the verdict).
        authenticated.catch(() => undefined);
        return false;
      }
      caller = authenticated;
      const manager = this.tokens.manager(client === '' ? undefined : client);
      clientId = manager.client.id;
      if (caller.clients !== '*' && !caller.clients.has(clientId)) return false;
      minMs = parseMinTtl(minTtl === '' ? undefined : minTtl) * 1000;
      const hit = manager.peek(minMs);
      if (hit === undefined) return false;
      manager.l1Hits.count++;
      const reqId = requestIdFrom(req.headers['x-request-id']);
      this.route.auditIssued(reqId, caller, clientId, hit);
      const body = tokenBody(hit, Date.now());
      res.writeHead(200, {
        'content-type': 'application/json; charset=utf-8',
        'content-length': body.length,
        'cache-control': 'no-store',
        pragma: 'no-cache',
        'x-request-id': reqId,
        ...SECURITY_HEADERS,
      });
      res.end(body);
      this.httpMetrics.requests.record('/token', 'GET', 200);
      return true;
    } catch {
      return false;
    }
  }
}
