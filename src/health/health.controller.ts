import { Controller, Get, Req, Res, ServiceUnavailableException } from '@nestjs/common';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { HealthCheck, HealthCheckService, HealthIndicatorService } from '@nestjs/terminus';
import { replicaReady, servable } from '../token/client-readiness';
import { TokenService } from '../token/token.service';
import { arrivedOnAdminListener } from '../http/listeners';
import { DrainState } from './drain-state';

/**
 * Ready when the replica can serve (`replicaReady`): one client's failure is that client's, named
 * in the details, never every merchant's. A later provider outage does not make a replica unready:
 * callers must keep reaching it for the still-valid token. Redis down is `degraded`, still ready;
 * Redis refusing the broker's settings is not. The full report names secrets, so it is answered on
 * the admin listener only.
 */
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly indicators: HealthIndicatorService,
    private readonly tokens: TokenService,
    private readonly drain: DrainState,
  ) {}

  @Get('live')
  live(): { status: 'ok' } {
    return { status: 'ok' };
  }

  @Get('ready')
  @HealthCheck()
  async ready(
    @Req() req: FastifyRequest,
    @Res({ passthrough: true }) reply: FastifyReply,
  ): Promise<unknown> {
    const detailed = arrivedOnAdminListener(req.raw.socket);
    try {
      const report = await this.health.check([
        () => this.drainIndicator(),
        () => this.tokenIndicator(),
        () => this.storeIndicator(),
      ]);
      return detailed ? report : { status: report.status };
    } catch (err) {
      // Terminus reports "not ready" by throwing: answer its report, not a generic error.
      if (err instanceof ServiceUnavailableException) {
        void reply.code(503).header('cache-control', 'no-store');
        return detailed ? err.getResponse() : { status: 'error' };
      }
      throw err;
    }
  }

  private drainIndicator() {
    const session = this.indicators.check('lifecycle');
    const since = this.drain.startedAt;
    return since === undefined
      ? session.up({ state: 'serving' })
      : session.down({ state: 'draining', since: new Date(since).toISOString() });
  }

  private tokenIndicator() {
    const session = this.indicators.check('tokens');
    const status = this.tokens.status().clients;
    const clients = status.map((c) => ({
      client: c.client,
      hasToken: c.hasToken,
      servable: servable(c),
      expiresAt: c.expiresAt !== undefined ? new Date(c.expiresAt).toISOString() : undefined,
      refreshing: c.refreshing,
      error:
        c.permanentError?.code ??
        (c.lifetimeError !== undefined ? 'token_lifetime_too_short' : undefined),
      detail: c.permanentError?.message ?? c.lifetimeError ?? c.lastError,
    }));
    const unservable = clients.filter((c) => !c.servable).map((c) => c.client);
    const required = this.tokens.requiredClients;
    const details = {
      clients,
      ...(unservable.length > 0 && { unservable }),
      ...(required.length > 0 && { requiredClients: required }),
    };
    return replicaReady(status, required) ? session.up(details) : session.down(details);
  }

  private storeIndicator() {
    const { store } = this.tokens.status();
    const session = this.indicators.check('store');
    if (store.kind === 'memory') return session.up({ kind: 'memory', note: 'single replica only' });
    // A bad setting never passes by itself: stop a rollout with it, and say which.
    if (store.configurationError !== undefined) {
      return session.down({
        kind: 'redis',
        error: 'redis_misconfigured',
        message: store.configurationError,
      });
    }
    return store.healthy
      ? session.up({ kind: 'redis' })
      : session.degraded({
          kind: 'redis',
          message: 'Redis unreachable: serving from memory, refreshing per replica',
        });
  }
}
