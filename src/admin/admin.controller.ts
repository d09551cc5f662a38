import { Controller, Get, Header, HttpCode, Param, Post, Req } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import { AdminService } from './admin.service';

/**
 * The operators' routes (docs/operations.md). Every answer is `no-store`; every error is
 * problem+json; every call writes one audit line (see {@link AdminService.run}).
 */
@Controller('admin')
export class AdminController {
  constructor(private readonly admin: AdminService) {}

  /** Every client in the caller's grant as this replica sees it, who holds its lock, the store. */
  @Get('clients')
  @Header('cache-control', 'no-store')
  async clients(@Req() req: FastifyRequest): Promise<unknown> {
    const status = await this.admin.run(req, 'status', undefined, (caller) =>
      this.admin.status(caller),
    );
    return {
      store: status.store,
      clients: status.clients.map((c) => ({
        ...c,
        expiresAt: iso(c.expiresAt),
        obtainedAt: iso(c.obtainedAt),
        lastRefresh: c.lastRefresh && { at: iso(c.lastRefresh.at), outcome: c.lastRefresh.outcome },
      })),
    };
  }

  /** A new token for the whole fleet: one provider request, adopted by every replica. */
  @Post('clients/:id/refresh')
  @HttpCode(200)
  @Header('cache-control', 'no-store')
  async refresh(@Req() req: FastifyRequest, @Param('id') id: string): Promise<unknown> {
    const askedAt = Date.now();
    const r = await this.admin.run(
      req,
      'refresh',
      id,
      (_caller, client) => this.admin.refresh(client!, askedAt),
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

  /** Drops the client's token fleet-wide, for good (a new generation). */
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
      }),
    );
  }

  /**
   * Client credentials and caller grants re-read now, here and on every replica; names only.
   * Fleet-wide: for callers granted every client (`"*"`) only.
   */
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
