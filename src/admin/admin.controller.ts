import { Controller, Get, Header, HttpCode, Param, Post, Req } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import { REPLICA_ID } from '../token/token-store';
import { TokenService } from '../token/token.service';
import { AdminService } from './admin.service';

/** Every answer is `no-store`, every error problem+json, every call one audit line. */
@Controller('admin')
export class AdminController {
  constructor(
    private readonly admin: AdminService,
    private readonly tokens: TokenService,
  ) {}

  @Get('clients')
  @Header('cache-control', 'no-store')
  async clients(@Req() req: FastifyRequest): Promise<unknown> {
    const status = await this.admin.run(req, 'status', undefined, (caller) =>
      this.tokens.adminStatus(caller),
    );
    return {
      // Each replica answers for itself: which one this is, as the lock holder is named.
      replica: REPLICA_ID,
      store: status.store,
      clients: status.clients.map((c) => ({
        ...c,
        expiresAt: iso(c.expiresAt),
        obtainedAt: iso(c.obtainedAt),
        lastRefresh: c.lastRefresh && { ...c.lastRefresh, at: iso(c.lastRefresh.at) },
      })),
    };
  }

  /** One provider request, adopted by every replica. */
  @Post('clients/:id/refresh')
  @HttpCode(200)
  @Header('cache-control', 'no-store')
  async refresh(@Req() req: FastifyRequest, @Param('id') id: string): Promise<unknown> {
    const askedAt = Date.now();
    const r = await this.admin.run(
      req,
      'refresh',
      id,
      (_caller, client) => this.tokens.forceRefresh(client!, askedAt),
      (r) => ({ fingerprint: r.fingerprint, providerRequest: r.fetched }),
    );
    return {
      client: id,
      fingerprint: r.fingerprint,
      expiresAt: iso(r.expiresAt),
      providerRequest: r.fetched,
      written: r.written,
    };
  }

  /** For good: a new generation. */
  @Post('clients/:id/revoke')
  @HttpCode(200)
  @Header('cache-control', 'no-store')
  revoke(@Req() req: FastifyRequest, @Param('id') id: string): Promise<unknown> {
    return this.admin.run(
      req,
      'revoke',
      id,
      (_caller, client) => this.admin.revoke(client!),
      (r) => ({
        generation: r.generation,
        fingerprint: r.revokedFingerprint,
        notified: r.replicas.notified,
        acknowledged: r.replicas.acknowledged,
        reissued: r.replacement?.reissued,
      }),
    );
  }

  /** Names only. Fleet-wide: for callers granted every client (`"*"`) only. */
  @Post('reload')
  @HttpCode(200)
  @Header('cache-control', 'no-store')
  reload(@Req() req: FastifyRequest): Promise<unknown> {
    return this.admin.run(
      req,
      'reload',
      undefined,
      () => this.admin.reload(),
      (r) => ({
        clients: r.clients,
        changedCredentials: r.credentials.changed,
        callers: 'error' in r.callers ? 'error' : r.callers,
        replicasNotified: 'notified' in r.replicas ? r.replicas.notified : 'error',
      }),
    );
  }
}

function iso(ms: number | undefined): string | undefined {
  return ms === undefined ? undefined : new Date(ms).toISOString();
}
