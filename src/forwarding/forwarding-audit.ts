import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { partialCallerContext } from '../caller-auth/caller-auth.guard';
import { AuditRateLimit } from '../logging/audit-rate-limit';
import type { ForwardingAudit } from './forwarding.service';
import { requestIdsOf } from '../http/request-id';

/**
 * The audit line of each request, never the token, only its fingerprint. Only refusals are
 * budgeted (`audit.refusalsPerSecond`): a request that reached the provider may have created
 * something there, so its line is always written.
 */
export class ForwardingAuditTrail {
  private readonly refusals: AuditRateLimit;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly logger: Logger,
    private readonly msg: string,
    settings: { refusalsPerSecond: number; intervalSeconds: number },
  ) {
    this.refusals = new AuditRateLimit(settings.refusalsPerSecond);
    this.timer = setInterval(() => this.reportSuppressed(), settings.intervalSeconds * 1000);
    this.timer.unref();
  }

  /** A caller-auth refusal adds what the caller was not told. */
  write(
    req: FastifyRequest,
    reply: FastifyReply,
    audit: ForwardingAudit,
    outcome: { status: number; result: string; err?: unknown },
    extra: Record<string, string | undefined> = {},
  ): void {
    if (!this.logger.isLevelEnabled('info')) return;
    const seen = partialCallerContext(req);
    const hidden = outcome.err instanceof CallerAuthException ? outcome.err.audit : {};
    const client = seen.clientId ?? hidden.client;
    if (outcome.err !== undefined && audit.attempts === 0) {
      const party = { caller: seen.caller?.name, client };
      if (!this.refusals.admit(outcome.result, Date.now(), party)) return;
      this.reportSuppressed();
    }
    const ids = requestIdsOf(req);
    this.logger.info(
      {
        reqId: ids.reqId,
        callerRequestId: ids.callerRequestId,
        caller: seen.caller?.name,
        client,
        ...extra,
        fp: audit.tokenFingerprint,
        idemKeyHash: audit.idempotencyKeyHash,
        attempts: audit.attempts,
        status: outcome.status,
        result: outcome.result,
        reason: hidden.reason,
        durationMs: Math.round(reply.elapsedTime * 10) / 10,
      },
      this.msg,
    );
  }

  close(): void {
    clearInterval(this.timer);
    this.reportSuppressed();
  }

  private reportSuppressed(): void {
    this.refusals.reportSuppressed(this.logger, this.msg);
  }
}
