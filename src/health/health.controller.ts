import { Controller, Get, Req, Res, ServiceUnavailableException } from '@nestjs/common';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { HealthCheck, HealthCheckService, HealthIndicatorService } from '@nestjs/terminus';
import { TokenService } from '../token/token.service';
import { arrivedOnAdminListener } from '../http/listeners';
import { DrainState } from './drain-state';

/**
 * Liveness and readiness. Neither requires caller authentication.
 *
 * Ready means: every client's credentials load and the provider has granted a token since
 * start-up. A later provider outage does not make the replica unready: callers must keep
 * reaching it to get the still-valid token, and after expiry a 503 with `Retry-After` beats a
 * connection refused. Refused or unreadable credentials make it unready once no valid token is
 * left. Redis down is `degraded`, still ready; Redis refusing the broker's settings
 * (authentication, ACL, TLS trust) is not ready, naming the cause.
 *
 * The report (clients, token expiries, error messages naming secrets) is for operators: it is
 * answered in full on the admin listener only. Elsewhere readiness answers its status alone,
 * `{"status":"ok"}` or 503 `{"status":"error"}`, which is all a probe or a Service needs.
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
    // The admin listener when there is one; with a single listener, no caller gets the report.
    const detailed = arrivedOnAdminListener(req.raw.socket);
    try {
      const report = await this.health.check([
        () => this.drainIndicator(),
        () => this.tokenIndicator(),
        () => this.storeIndicator(),
      ]);
      return detailed ? report : { status: report.status };
    } catch (err) {
      // Terminus reports "not ready" by throwing; answer its report with 503 rather than
      // letting the problem filter turn it into a generic error.
      if (err instanceof ServiceUnavailableException) {
        void reply.code(503).header('cache-control', 'no-store');
        return detailed ? err.getResponse() : { status: 'error' };
      }
      throw err;
    }
  }

  /** Not ready from the moment SIGTERM arrives: the pod leaves the Service while it drains. */
  private drainIndicator() {
    const session = this.indicators.check('lifecycle');
    const since = this.drain.startedAt;
    return since === undefined
      ? session.up({ state: 'serving' })
      : session.down({ state: 'draining', since: new Date(since).toISOString() });
  }

  private tokenIndicator() {
    const session = this.indicators.check('tokens');
    const clients = this.tokens.status().clients.map((c) => ({
      client: c.client,
      hasToken: c.hasToken,
      expiresAt: c.expiresAt !== undefined ? new Date(c.expiresAt).toISOString() : undefined,
      refreshing: c.refreshing,
      error:
        c.permanentError?.code ??
        (c.lifetimeError !== undefined ? 'token_lifetime_too_short' : undefined),
      detail: c.permanentError?.message ?? c.lifetimeError ?? c.lastError,
    }));
    // A replica that still holds a valid token can serve it: it stays ready (the error shows in
    // `detail`) until that token expires. Every replica shares the credentials, so taking them
    // all out of service at the first refused refresh would fail callers while tokens are valid.
    // Tokens too short-lived to serve and refresh are a mismatch to fix (the provider's lifetime
    // or TOKEN_MIN_REFRESH_INTERVAL_MS): not ready, whatever is held for the odd second.
    const failing = this.tokens
      .status()
      .clients.filter(
        (c) =>
          (c.permanentError !== undefined && !c.hasToken) ||
          !c.everObtained ||
          c.lifetimeError !== undefined,
      );
    return failing.length === 0 ? session.up({ clients }) : session.down({ clients });
  }

  private storeIndicator() {
    const { store } = this.tokens.status();
    const session = this.indicators.check('store');
    if (store.kind === 'memory') return session.up({ kind: 'memory', note: 'single replica only' });
    // Refused credentials, a forbidding ACL or an untrusted certificate never pass by
    // themselves: take the replica out of rotation so a rollout with a bad setting stops, and
    // say which setting.
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
