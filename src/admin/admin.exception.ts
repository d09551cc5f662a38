import { BrokerException, type ProblemStatus, type ProblemTable } from '../errors/broker.exception';

/** Why an admin route could not do what it was asked (problem codes). */
export enum AdminErrorCode {
  /**
   * 503: the shared store (Redis) does not answer, and a fleet-wide action needs it: a refresh
   * or revoke done by this replica alone would leave the others serving the old token.
   */
  StoreUnavailable = 'admin_store_unavailable',
  /** 502: the forced refresh asked the provider, which did not grant a token. */
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
