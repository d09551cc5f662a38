import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Caller } from '../caller-auth/caller';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { partialCallerContext } from '../caller-auth/caller-auth.guard';
import { AuditRateLimit } from '../logging/audit-rate-limit';
import type { ForwardingAudit } from './forwarding';
import { requestIdsOf } from '../http/request-id';

/**
 * A forwarding route's audit trail (`"audit":"orders"`, `"audit":"forward"`): its logger,
 * and the budget its refusals share, as token refusals do (`audit.refusalsPerSecond`, per kind:
 * see {@link AuditRateLimit}). Only refusals are budgeted: a request that reached the provider
 * (`attempts` > 0) may have created something there, and is always written. The rest are
 * counted in a `<msg> refusals suppressed` line, written with the next admitted refusal, every
 * `audit.intervalSeconds` and at shutdown.
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
    now = Date.now(),
  ): boolean {
    if (outcome.err === undefined || audit.attempts > 0) return true;
    const admitted = this.refusals.admit(outcome.result, now, {
      caller: party.caller?.name,
      client: party.client,
    });
    if (admitted) this.reportSuppressed();
    return admitted;
  }

  /** Writes the count of refusals left out, if any. */
  reportSuppressed(): void {
    const left = this.refusals.takeSuppressed();
    if (left === undefined || !this.enabled) return;
    this.logger.info(
      {
        suppressed: left.suppressed,
        results: left.results,
        callers: left.callers,
        clients: left.clients,
        first: new Date(left.first).toISOString(),
        last: new Date(left.last).toISOString(),
      },
      `${this.msg} refusals suppressed`,
    );
  }

  /** Whether lines are written at all (the logger's level). */
  get enabled(): boolean {
    return this.logger.isLevelEnabled('info');
  }

  /** At shutdown: stops the timer and reports what is left. */
  close(): void {
    clearInterval(this.timer);
    this.reportSuppressed();
  }
}

/**
 * The audit line of a forwarded request (`POST /orders`, the passthrough): caller, client,
 * token fingerprint (never the token), idempotency key hash, attempts, outcome; fields not known
 * (yet) are left out, as pino leaves out `undefined`.
 *
 * @param err The refusal, if any: a caller-auth refusal adds what the caller was not told.
 * @param extra Fields of the route's own, written after the client.
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
