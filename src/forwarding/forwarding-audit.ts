import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { partialCallerContext } from '../caller-auth/caller-auth.guard';
import { AuditRateLimit } from '../logging/audit-rate-limit';
import type { ForwardingAudit } from './forwarding';
import { requestIdsOf } from '../http/request-id';

/**
 * Only refusals are budgeted (`audit.refusalsPerSecond`): a request that reached the provider
 * may have created something there, so its line is always written.
 */
export class ForwardingAuditTrail {
  private readonly refusals: AuditRateLimit;
  private readonly timer: NodeJS.Timeout;

  constructor(
    readonly logger: Logger,
    readonly msg: string,
    settings: { refusalsPerSecond: number; intervalSeconds: number },
  ) {
    this.refusals = new AuditRateLimit(settings.refusalsPerSecond);
    this.timer = setInterval(() => this.reportSuppressed(), settings.intervalSeconds * 1000);
    this.timer.unref();
  }

  /** Whether this outcome's line may be written now; counts it if not. */
  admit(
    party: { caller?: Caller | undefined; client?: string | undefined },
    audit: ForwardingAudit,
    outcome: { result: string; err?: unknown },
  ): boolean {
    if (outcome.err === undefined || audit.attempts > 0) return true;
    const admitted = this.refusals.admit(outcome.result, Date.now(), {
      caller: party.caller?.name,
      client: party.client,
    });
    if (admitted) this.reportSuppressed();
    return admitted;
  }

  private reportSuppressed(): void {
    this.refusals.reportSuppressed(this.logger, this.msg);
  }

  get enabled(): boolean {
    return this.logger.isLevelEnabled('info');
  }

  close(): void {
    clearInterval(this.timer);
    this.reportSuppressed();
  }
}

/**
 * Never the token, only its fingerprint. A caller-auth refusal adds what the caller was not
 * told.
 */
export function writeForwardingAudit(
  trail: ForwardingAuditTrail,
  req: FastifyRequest,
  reply: FastifyReply,
  audit: ForwardingAudit,
  outcome: { status: number; result: string; err?: unknown },
  extra: Record<string, string | undefined> = {},
): void {
  if (!trail.enabled) return;
  const seen = partialCallerContext(req);
  const hidden = outcome.err instanceof CallerAuthException ? outcome.err.audit : {};
  const party = { caller: seen.caller, client: seen.clientId ?? hidden.client };
  if (!trail.admit(party, audit, outcome)) return;
  const ids = requestIdsOf(req);
  trail.logger.info(
    {
      reqId: ids.reqId,
      callerRequestId: ids.callerRequestId,
      caller: seen.caller?.name,
      client: party.client,
      ...extra,
      fp: audit.tokenFingerprint,
      idemKeyHash: audit.idempotencyKeyHash,
      attempts: audit.attempts,
      status: outcome.status,
      result: outcome.result,
      reason: hidden.reason,
      durationMs: Math.round(reply.elapsedTime * 10) / 10,
    },
    trail.msg,
  );
}
