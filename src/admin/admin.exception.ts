import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

export enum AdminErrorCode {
  /** A refresh or revoke by this replica alone would leave the others serving the old token. */
  StoreUnavailable = 'admin_store_unavailable',
  RefreshFailed = 'admin_refresh_failed',
}

export const ADMIN_PROBLEMS: ProblemTable<AdminErrorCode> = {
  [AdminErrorCode.StoreUnavailable]: {
    status: 503,
    title: 'Shared store unavailable',
    retryAfterSeconds: 2,
  },
  [AdminErrorCode.RefreshFailed]: { status: 502, title: 'Forced refresh failed' },
};

export class AdminException extends BrokerException<AdminErrorCode> {
  override get problemStatus(): ProblemStatus {
    return ADMIN_PROBLEMS[this.code];
  }
}
