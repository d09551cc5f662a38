import type { FastifyReply, FastifyRequest } from 'fastify';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { partialCallerContext } from '../caller-auth/caller-auth.guard';
import { AuditTrail } from '../logging/audit-trail';
import type { ForwardingAudit } from './forwarding.service';
import { requestIdsOf } from '../http/request-id';

/**
 * The audit line of each request, never the token, only its fingerprint. Only refusals are
 * budgeted (`audit.refusalsPerSecond`): a request that reached the provider may have created
 * something there, so its line is always written.
 */
export class ForwardingAuditTrail extends AuditTrail {
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
      if (!this.admit(outcome.result, Date.now(), party)) return;
      this.reportSuppressed();
    }
    this.logger.info(
      {
        ...requestIdsOf(req),
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
      this.trail,
    );
  }
}
