import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Caller } from '../caller-auth/caller';
import { CallerAuthException } from '../caller-auth/caller-auth.exception';
import { partialCallerContext } from '../caller-auth/caller-auth.guard';
import { AuditLineWriter } from '../logging/audit-line.writer';
import type { ForwardingAudit } from './forwarding';

/**
 * The audit line of a forwarded request (`POST /orders`, the passthrough): caller, client,
 * token fingerprint (never the token), idempotency key hash, attempts, outcome. Every field is
 * one the broker computed or validated, so the line is written directly in pino's format (see
 * {@link AuditLineWriter}); fields not known (yet) are left out, as pino leaves out `undefined`.
 *
 * @param err The refusal, if any: a caller-auth refusal adds what the caller was not told.
 * @param extra Fields of the route's own, written after the client (already formatted).
 */
export function writeForwardingAudit(
  line: AuditLineWriter,
  req: FastifyRequest,
  reply: FastifyReply,
  audit: ForwardingAudit,
  outcome: { status: number; result: string; err?: unknown },
  extra = '',
): void {
  if (!line.enabled) return;
  const seen = partialCallerContext(req);
  writeForwardingAuditLine(
    line,
    { reqId: req.id, ...seen, durationMs: reply.elapsedTime },
    audit,
    outcome,
    extra,
  );
}

/** Who made a forwarded request and how long it took, as far as the broker got. */
export interface ForwardedRequest {
  readonly reqId: string;
  readonly caller?: Caller;
  readonly clientId?: string;
  /** From the request's arrival to its answer. */
  readonly durationMs: number;
}

/** {@link writeForwardingAudit}'s line from what is known of the request. */
export function writeForwardingAuditLine(
  line: AuditLineWriter,
  request: ForwardedRequest,
  audit: ForwardingAudit,
  outcome: { status: number; result: string; err?: unknown },
  extra = '',
): void {
  if (!line.enabled) return;
  const hidden = outcome.err instanceof CallerAuthException ? outcome.err.audit : {};
  const caller = request.caller;
  const clientId = request.clientId ?? hidden.client;
  const field = AuditLineWriter.field;
  line.write(
    field('reqId', request.reqId) +
      (caller ? field('caller', caller.name) : '') +
      (clientId !== undefined ? field('client', clientId) : '') +
      extra +
      (audit.tokenFingerprint !== undefined ? field('fp', audit.tokenFingerprint) : '') +
      (audit.idempotencyKeyHash !== undefined
        ? field('idemKeyHash', audit.idempotencyKeyHash)
        : '') +
      field('attempts', audit.attempts) +
      field('status', outcome.status) +
      field('result', outcome.result) +
      (hidden.reason !== undefined ? field('reason', hidden.reason) : '') +
      field('durationMs', Math.round(request.durationMs * 10) / 10),
  );
}
