import { ADMIN_PROBLEMS, type AdminErrorCode } from '../admin/admin.exception';
import {
  CALLER_AUTH_PROBLEMS,
  type CallerAuthErrorCode,
} from '../caller-auth/caller-auth.exception';
import type { ProblemStatus } from '../errors/broker.exception';
import { FORWARD_PROBLEMS, type ForwardErrorCode } from '../forwarding/forward.exception';
import { REQUEST_PROBLEMS, type RequestErrorCode } from '../http/request.exception';
import { ORDERS_PROBLEMS, type OrdersErrorCode } from '../forwarding/orders.exception';
import { TOKEN_PROBLEMS, type TokenErrorCode } from '../token/token.exception';

export type ProblemCode =
  | TokenErrorCode
  | CallerAuthErrorCode
  | RequestErrorCode
  | OrdersErrorCode
  | AdminErrorCode
  | ForwardErrorCode
  | 'internal_error';

// The document reads each domain's own table, the one its exceptions carry: it cannot drift
// from what the problem writer answers.
const STATUSES: Readonly<Record<ProblemCode, ProblemStatus>> = {
  ...TOKEN_PROBLEMS,
  ...CALLER_AUTH_PROBLEMS,
  ...REQUEST_PROBLEMS,
  ...ORDERS_PROBLEMS,
  ...ADMIN_PROBLEMS,
  ...FORWARD_PROBLEMS,
  internal_error: { status: 500, title: 'Internal error' },
};

export function statusFor(code: ProblemCode): ProblemStatus {
  return STATUSES[code];
}
